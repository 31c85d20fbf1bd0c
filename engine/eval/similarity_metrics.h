#pragma once
// Text similarity of a prediction to its label, computed exactly as LLaMA-Factory's
// ComputeSimilarity (src/llamafactory/train/sft/metric.py) does for predict_with_generate:
//
//   hypothesis = list(jieba.cut(pred)); reference = list(jieba.cut(label))
//   ROUGE-1/2/L: rouge_chinese.Rouge().get_scores(" ".join(hypothesis), " ".join(reference))
//                f-scores; all 0 when either side has no non-space token
//   BLEU-4:      nltk sentence_bleu([list(label)], list(pred), smoothing method3), on characters
//   each ×100 and round(·, 4) per sample; the dataset score is np.mean of the samples.
//
// BLEU-1..3 are Tandem's additions, the same call with uniform weights over 1..n-grams
// ((1,), (1/2, 1/2), (1/3, 1/3, 1/3)); BLEU-4's weights are nltk's default (1/4 each).
// Reference versions: jieba 0.42.1, rouge-chinese 1.0.3, nltk 3.10.4 (tests/eval checks them).

#include <array>
#include <string>
#include <string_view>

namespace tandem::eval {

class JiebaSegmenter;

// f-scores of rouge_chinese's Rouge().get_scores(hypothesis, reference)[0] (unscaled, 0..1).
// Both texts must hold a non-space character (rouge_chinese raises otherwise).
struct RougeScores {
  double rouge_1 = 0;
  double rouge_2 = 0;
  double rouge_l = 0;
};
RougeScores rougeChinese(std::u32string_view hypothesis, std::u32string_view reference);

// nltk sentence_bleu([reference], hypothesis, weights=(1/n,)*n, SmoothingFunction().method3)
// for n = 1..4 (index n-1), tokens being the code points (unscaled, 0..1).
std::array<double, 4> sentenceBleuChars(std::u32string_view hypothesis,
                                        std::u32string_view reference);

// One sample in LLaMA-Factory's units: ×100, rounded to 4 decimals.
struct SimilarityScores {
  std::array<double, 4> bleu{};  // bleu[0] = BLEU-1 ... bleu[3] = BLEU-4
  double rouge_1 = 0;
  double rouge_2 = 0;
  double rouge_l = 0;
};
SimilarityScores scoreSimilarity(const JiebaSegmenter& jieba, std::string_view prediction,
                                 std::string_view label);

}  // namespace tandem::eval
