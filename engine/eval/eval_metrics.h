#pragma once
// The scores of an evaluation, in the files LLaMA-Factory writes for `do_predict` with
// `predict_with_generate`:
//   generated_predictions.jsonl  one {"prompt", "predict", "label"} object per line
//   predict_results.json         predict_bleu-4, predict_rouge-1/2/l (+ Tandem's additions)
// and sample_scores.jsonl (Tandem's): every sample's scores, to find the worst answers.
// How each number is computed: similarity_metrics.h, choice_answer.h, docs/eval.md.

#include <array>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/eval/similarity_metrics.h"

namespace tandem::eval {

struct PredictionRow {
  std::string prompt;   // the model input as text (special tokens kept), may be empty
  std::string predict;  // the generated answer
  std::string label;    // the reference answer
};

// One line of generated_predictions.jsonl, formatted as Python's
// json.dumps({...}, ensure_ascii=False) + "\n" (keys in LLaMA-Factory's order).
std::string predictionLine(const PredictionRow& row);

struct BadRow {
  int64_t line = 0;  // 1-based
  std::string reason;
};

struct PredictionsFile {
  static constexpr size_t kMaxReportedProblems = 5;
  std::vector<PredictionRow> rows;
  int64_t bad_rows = 0;                // lines that are not {"predict": str, "label": str, ...}
  std::vector<BadRow> first_problems;  // at most kMaxReportedProblems
};

// Reads a generated_predictions.jsonl (blank lines ignored). Bad rows are counted and skipped;
// a missing or unreadable file is a tandem::Error.
PredictionsFile readPredictions(const std::filesystem::path& path);

// Scores of one sample; `choice_*` only when choices are scored and the label names a choice.
struct SampleScores {
  SimilarityScores similarity;
  std::optional<char> label_choice;
  std::optional<char> predicted_choice;
};

// Per-sample scores in, dataset scores out: np.mean over samples, as LLaMA-Factory.
class MetricsAccumulator {
 public:
  void add(const SampleScores& sample);
  int64_t samples() const { return static_cast<int64_t>(rouge_1_.size()); }

  // predict_results.json: the LLaMA-Factory keys (predict_bleu-4, predict_rouge-1,
  // predict_rouge-2, predict_rouge-l) and Tandem's (predict_bleu-1..3, predict_samples, and
  // with choices predict_accuracy and predict_choice_samples). No samples: only the counts.
  nlohmann::json results() const;

 private:
  std::array<std::vector<double>, 4> bleu_;
  std::vector<double> rouge_1_, rouge_2_, rouge_l_;
  std::vector<double> choice_correct_;  // 1 or 0 per sample whose label names a choice
};

// One line of sample_scores.jsonl for sample `index` (0-based, its row in the dataset or file).
std::string sampleScoresLine(int64_t index, const SampleScores& sample);

// Scores one prediction: similarity always, the choice letters when `choice_letters` is not empty.
SampleScores scoreSample(const JiebaSegmenter& jieba, const PredictionRow& row,
                         std::string_view choice_letters);

}  // namespace tandem::eval
