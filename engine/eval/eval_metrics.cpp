#include "engine/eval/eval_metrics.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"
#include "engine/eval/choice_answer.h"
#include "engine/eval/python_semantics.h"
#include "engine/io/bounded_json.h"

namespace tandem::eval {

namespace {

using Json = nlohmann::json;

// A JSON string as json.dumps(..., ensure_ascii=False) writes it; malformed UTF-8 (a model can
// stop inside a multi-byte character) becomes U+FFFD, as tokenizers' decode does.
std::string jsonString(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A scores-file number: Python's repr of a float.
std::string jsonNumber(double value) { return Json(value).dump(); }

void addBadRow(PredictionsFile& file, int64_t line, std::string reason) {
  ++file.bad_rows;
  if (file.first_problems.size() < PredictionsFile::kMaxReportedProblems) {
    file.first_problems.push_back({line, std::move(reason)});
  }
}

std::optional<std::string> stringField(const Json& row, const char* key, std::string& reason) {
  const auto it = row.find(key);
  if (it == row.end()) {
    reason = std::string("no \"") + key + "\" key";
    return std::nullopt;
  }
  if (!it->is_string()) {
    reason = std::string("\"") + key + "\" is " + it->type_name() + ", not a string";
    return std::nullopt;
  }
  return it->get<std::string>();
}

}  // namespace

std::string predictionLine(const PredictionRow& row) {
  return "{\"prompt\": " + jsonString(row.prompt) + ", \"predict\": " + jsonString(row.predict) +
         ", \"label\": " + jsonString(row.label) + "}\n";
}

PredictionsFile readPredictions(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error("cannot read the predictions file " + path.string(),
                "pass a generated_predictions.jsonl written by `tandem eval` or LLaMA-Factory");
  }
  PredictionsFile file;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::optional<Json> parsed = io::tryParseBoundedJson(line, io::kDatasetJsonLimits);
    if (!parsed || !parsed->is_object()) {
      addBadRow(file, line_no,
                !parsed ? "not valid JSON (or not UTF-8, or nested more than " +
                              std::to_string(io::kDatasetJsonLimits.max_depth) + " levels deep)"
                        : "not a JSON object");
      continue;
    }
    const Json& row = *parsed;
    std::string reason;
    const auto predict = stringField(row, "predict", reason);
    const auto label = predict ? stringField(row, "label", reason) : std::nullopt;
    if (!predict || !label) {
      addBadRow(file, line_no, reason);
      continue;
    }
    std::string prompt;
    if (const auto it = row.find("prompt"); it != row.end() && it->is_string())
      prompt = it->get<std::string>();
    file.rows.push_back({std::move(prompt), *predict, *label});
  }
  if (in.bad()) throw Error("reading " + path.string() + " failed", "check the disk and the file");
  return file;
}

SampleScores scoreSample(const JiebaSegmenter& jieba, const PredictionRow& row,
                         std::string_view choice_letters) {
  SampleScores sample;
  sample.similarity = scoreSimilarity(jieba, row.predict, row.label);
  if (!choice_letters.empty()) {
    sample.label_choice = extractChoice(row.label, choice_letters);
    if (sample.label_choice) sample.predicted_choice = extractChoice(row.predict, choice_letters);
  }
  return sample;
}

void MetricsAccumulator::add(const SampleScores& sample) {
  for (size_t i = 0; i < 4; ++i) bleu_[i].push_back(sample.similarity.bleu[i]);
  rouge_1_.push_back(sample.similarity.rouge_1);
  rouge_2_.push_back(sample.similarity.rouge_2);
  rouge_l_.push_back(sample.similarity.rouge_l);
  if (sample.label_choice)
    choice_correct_.push_back(sample.predicted_choice == sample.label_choice ? 1.0 : 0.0);
}

Json MetricsAccumulator::results() const {
  Json out = Json::object();
  out["predict_samples"] = samples();
  if (samples() > 0) {
    for (size_t i = 0; i < 4; ++i)
      out["predict_bleu-" + std::to_string(i + 1)] = py::numpyMean(bleu_[i]);
    out["predict_rouge-1"] = py::numpyMean(rouge_1_);
    out["predict_rouge-2"] = py::numpyMean(rouge_2_);
    out["predict_rouge-l"] = py::numpyMean(rouge_l_);
  }
  if (!choice_correct_.empty()) {
    // ×100 like the other scores (LLaMA-Factory's evaluator prints accuracy in percent).
    out["predict_accuracy"] = 100.0 * py::numpyMean(choice_correct_);
    out["predict_choice_samples"] = static_cast<int64_t>(choice_correct_.size());
  }
  return out;
}

std::string sampleScoresLine(int64_t index, const SampleScores& sample) {
  const SimilarityScores& s = sample.similarity;
  std::ostringstream line;
  line << "{\"index\": " << index;
  for (size_t i = 0; i < 4; ++i) line << ", \"bleu-" << i + 1 << "\": " << jsonNumber(s.bleu[i]);
  line << ", \"rouge-1\": " << jsonNumber(s.rouge_1) << ", \"rouge-2\": " << jsonNumber(s.rouge_2)
       << ", \"rouge-l\": " << jsonNumber(s.rouge_l);
  if (sample.label_choice) {
    line << ", \"label_choice\": \"" << *sample.label_choice << "\", \"predicted_choice\": "
         << (sample.predicted_choice ? "\"" + std::string(1, *sample.predicted_choice) + "\""
                                     : "null");
  }
  line << "}\n";
  return line.str();
}

}  // namespace tandem::eval
