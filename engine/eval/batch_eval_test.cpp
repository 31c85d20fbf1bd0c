#include "engine/eval/batch_eval.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "engine/core/error.h"

namespace tandem::eval {
namespace {

namespace fs = std::filesystem;

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

class BatchEvalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           (std::string("tandem_batch_eval_") +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    settings_.output_dir = dir_ / "out";
    settings_.jieba_dir = TANDEM_JIEBA_DIR;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  BatchEvalSettings settings_;
};

TEST_F(BatchEvalTest, WritesTheThreeFilesAndSkipsSamplesThatFail) {
  settings_.bad_rows = 2;
  settings_.choice_letters = "ABCD";
  int64_t progress_calls = 0;
  const auto predict = [](int64_t i, std::stop_token) {
    if (i == 1) throw Error("prompt of sample 2 is longer than the context");
    return PredictionRow{"q" + std::to_string(i), i == 2 ? "B" : "A", "A"};
  };
  const BatchEvalResult result = runBatchEval(
      3, predict, settings_, [&](const BatchEvalProgress& p) { progress_calls = p.done; });
  EXPECT_EQ(progress_calls, 3);
  EXPECT_EQ(result.samples, 2);
  EXPECT_EQ(result.failed, 1);
  EXPECT_FALSE(result.stopped);
  ASSERT_EQ(result.first_failures.size(), 1u);
  EXPECT_EQ(result.first_failures[0].line, 2);
  EXPECT_EQ(result.results["predict_bad_rows"], 3);
  EXPECT_EQ(result.results["predict_accuracy"].get<double>(), 50.0);
  EXPECT_EQ(readFile(settings_.output_dir / "generated_predictions.jsonl"),
            "{\"prompt\": \"q0\", \"predict\": \"A\", \"label\": \"A\"}\n"
            "{\"prompt\": \"q2\", \"predict\": \"B\", \"label\": \"A\"}\n");
  const std::string scores = readFile(settings_.output_dir / "sample_scores.jsonl");
  EXPECT_NE(scores.find("{\"index\": 2,"), std::string::npos) << scores;
  const auto written =
      nlohmann::json::parse(readFile(settings_.output_dir / "predict_results.json"));
  EXPECT_EQ(written, result.results);
}

TEST_F(BatchEvalTest, AStopWritesTheSamplesDoneSoFar) {
  std::stop_source stop;
  const auto predict = [&](int64_t i, std::stop_token token) {
    if (i == 2) {
      stop.request_stop();  // as Ctrl-C during sample 3's generation
      if (token.stop_requested()) throw Cancelled();
    }
    return PredictionRow{"", "x", "x"};
  };
  settings_.write_predictions = false;
  const BatchEvalResult result = runBatchEval(10, predict, settings_, {}, stop.get_token());
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.samples, 2);
  EXPECT_EQ(result.results["predict_samples"], 2);
  EXPECT_EQ(result.results["predict_samples_requested"], 10);
  EXPECT_FALSE(fs::exists(settings_.output_dir / "generated_predictions.jsonl"));
  EXPECT_TRUE(fs::exists(settings_.output_dir / "predict_results.json"));
}

TEST_F(BatchEvalTest, OtherErrorsPropagateAfterWriting) {
  const auto predict = [](int64_t i, std::stop_token) -> PredictionRow {
    if (i == 1) throw std::runtime_error("device lost");
    return {"", "x", "x"};
  };
  EXPECT_THROW(runBatchEval(3, predict, settings_), std::runtime_error);
  EXPECT_EQ(nlohmann::json::parse(
                readFile(settings_.output_dir / "predict_results.json"))["predict_samples"],
            1);
}

TEST_F(BatchEvalTest, AnUnwritableOutputDirIsAnError) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "file") << "x";
  settings_.output_dir = dir_ / "file" / "out";
  EXPECT_THROW(runBatchEval(
                   1,
                   [](int64_t, std::stop_token) {
                     return PredictionRow{"", "a", "a"};
                   },
                   settings_),
               Error);
}

}  // namespace
}  // namespace tandem::eval
