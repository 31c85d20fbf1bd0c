#include "engine/eval/similarity_metrics.h"

#include <gtest/gtest.h>

#include "engine/eval/jieba_segmenter.h"

namespace tandem::eval {
namespace {

const JiebaSegmenter& jieba() { return JiebaSegmenter::shared(TANDEM_JIEBA_DIR); }

// Expected values: rouge_chinese 1.0.3 and nltk 3.10.4 on the same inputs (repr of the floats).
TEST(SimilarityMetrics, RougeAndBleuOnEnglish) {
  const RougeScores rouge = rougeChinese(U"the cat sat on the mat", U"the cat is on the mat");
  EXPECT_EQ(rouge.rouge_1, 0.7999999950000002);
  EXPECT_EQ(rouge.rouge_2, 0.5999999950000001);
  EXPECT_EQ(rouge.rouge_l, 0.8333333283333335);
  const auto bleu = sentenceBleuChars(U"the cat sat on the mat", U"the cat is on the mat");
  EXPECT_EQ(bleu[0], 0.9090909090909091);
  EXPECT_EQ(bleu[1], 0.8578640544577771);
  EXPECT_EQ(bleu[2], 0.8202874522394789);
  EXPECT_EQ(bleu[3], 0.7839204411491599);
}

TEST(SimilarityMetrics, ChineseSentencesThroughJieba) {
  const SimilarityScores s =
      scoreSimilarity(jieba(), "今天天气很好。我们去公园吧！", "今天天气不错，我们去公园玩吧。");
  EXPECT_EQ(s.rouge_1, 58.8235);
  EXPECT_EQ(s.rouge_2, 26.6667);
  EXPECT_EQ(s.rouge_l, 47.0588);
  EXPECT_EQ(s.bleu[0], 73.1549);
  EXPECT_EQ(s.bleu[3], 43.5977);
}

TEST(SimilarityMetrics, BrevityPenaltyAndSmoothing) {
  const auto bleu = sentenceBleuChars(U"我爱北京天安门", U"我爱北京");
  EXPECT_EQ(bleu[0], 0.5714285714285714);
  EXPECT_EQ(bleu[3], 0.41113361690051975);
}

TEST(SimilarityMetrics, EmptySidesScoreZero) {
  for (const auto& [pred, label] :
       {std::pair{"", "abc"}, std::pair{"abc", ""}, std::pair{" \n", "abc"}}) {
    const SimilarityScores s = scoreSimilarity(jieba(), pred, label);
    EXPECT_EQ(s.rouge_1, 0.0);
    EXPECT_EQ(s.rouge_l, 0.0);
    EXPECT_EQ(s.bleu[3], 0.0);
  }
  EXPECT_EQ(scoreSimilarity(jieba(), "same", "same").bleu[3], 100.0);
}

}  // namespace
}  // namespace tandem::eval
