#include "engine/eval/eval_metrics.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/eval/jieba_segmenter.h"

namespace tandem::eval {
namespace {

const JiebaSegmenter& jieba() { return JiebaSegmenter::shared(TANDEM_JIEBA_DIR); }

std::filesystem::path writeTemp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(EvalMetrics, PredictionLineIsPythonsJsonDumps) {
  EXPECT_EQ(predictionLine({"p\n", "答案 \"A\"", "x\x01"}),
            "{\"prompt\": \"p\\n\", \"predict\": \"答案 \\\"A\\\"\", \"label\": \"x\\u0001\"}\n");
  // A model may stop inside a multi-byte character: written as U+FFFD, never a crash.
  EXPECT_EQ(predictionLine({"", "\xE4\xBD", ""}),
            "{\"prompt\": \"\", \"predict\": \"\xEF\xBF\xBD\", \"label\": \"\"}\n");
}

TEST(EvalMetrics, BadRowsAreCountedNotFatal) {
  const auto path = writeTemp("tandem_eval_metrics_test.jsonl",
                              "{\"prompt\": \"q\", \"predict\": \"a\", \"label\": \"a\"}\n"
                              "\n"
                              "not json\n"
                              "{\"predict\": 3, \"label\": \"a\"}\n"
                              "[1, 2]\n"
                              "{\"label\": \"only\"}\n"
                              "{\"predict\": \"b\", \"label\": \"c\"}\r\n");
  const PredictionsFile file = readPredictions(path);
  std::filesystem::remove(path);
  ASSERT_EQ(file.rows.size(), 2u);
  EXPECT_EQ(file.rows[0].prompt, "q");
  EXPECT_EQ(file.rows[1].label, "c");
  EXPECT_EQ(file.bad_rows, 4);
  ASSERT_EQ(file.first_problems.size(), 4u);
  EXPECT_EQ(file.first_problems[0].line, 3);
  EXPECT_EQ(file.first_problems[1].reason, "\"predict\" is number, not a string");
  EXPECT_EQ(file.first_problems[3].reason, "no \"predict\" key");
  EXPECT_THROW(readPredictions("/nonexistent/predictions.jsonl"), Error);
}

TEST(EvalMetrics, RowNestedPastTheLimitIsABadRow) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const auto path = writeTemp("tandem_eval_metrics_deep.jsonl",
                              "{\"predict\": \"a\", \"label\": \"a\", \"x\": " + deep + "}\n" +
                                  "{\"predict\": \"b\", \"label\": \"b\"}\n");
  const PredictionsFile file = readPredictions(path);
  std::filesystem::remove(path);
  EXPECT_EQ(file.rows.size(), 1u);
  EXPECT_EQ(file.bad_rows, 1);
  ASSERT_EQ(file.first_problems.size(), 1u);
  EXPECT_NE(file.first_problems[0].reason.find("nested"), std::string::npos)
      << file.first_problems[0].reason;
}

TEST(EvalMetrics, AccumulatesMeansAndAccuracy) {
  MetricsAccumulator acc;
  EXPECT_EQ(acc.results()["predict_samples"], 0);
  EXPECT_FALSE(acc.results().contains("predict_bleu-4"));
  const std::vector<SampleScores> samples = {
      scoreSample(jieba(), {"", "B", "B"}, "ABCD"),
      scoreSample(jieba(), {"", "The answer is C", "A"}, "ABCD"),
      scoreSample(jieba(), {"", "free text", "no letter here"}, "ABCD")};
  for (const SampleScores& sample : samples) acc.add(sample);
  const nlohmann::json results = acc.results();
  EXPECT_EQ(results["predict_samples"], 3);
  EXPECT_EQ(results["predict_choice_samples"], 2);
  EXPECT_EQ(results["predict_accuracy"].get<double>(), 50.0);
  const double rouge_l_sum =
      samples[0].similarity.rouge_l + samples[1].similarity.rouge_l + samples[2].similarity.rouge_l;
  EXPECT_EQ(results["predict_rouge-l"].get<double>(), rouge_l_sum / 3);
  EXPECT_EQ(samples[0].similarity.bleu[0], 100.0);
  EXPECT_GT(samples[2].similarity.bleu[0], 0.0);
}

TEST(EvalMetrics, SampleScoresLine) {
  const SampleScores s = scoreSample(jieba(), {"", "A", "A"}, "ABCD");
  const nlohmann::json line = nlohmann::json::parse(sampleScoresLine(7, s));
  EXPECT_EQ(line["index"], 7);
  EXPECT_EQ(line["rouge-1"].get<double>(), 100.0);  // round(0.999999995 * 100, 4)
  EXPECT_EQ(line["label_choice"], "A");
  EXPECT_EQ(line["predicted_choice"], "A");
}

}  // namespace
}  // namespace tandem::eval
