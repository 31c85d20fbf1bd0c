#include "engine/eval/batch_eval.h"

#include <chrono>
#include <exception>
#include <vector>

#include "engine/core/error.h"
#include "engine/eval/jieba_segmenter.h"
#include "engine/io/atomic_file.h"

namespace tandem::eval {

namespace {

// indices[k]: the sample number of rows[k] and scores[k] (skipped samples leave gaps).
void writeOutputs(const BatchEvalSettings& settings, const std::vector<PredictionRow>& rows,
                  const std::vector<SampleScores>& scores, const std::vector<int64_t>& indices,
                  const nlohmann::json& results) {
  std::error_code ec;
  std::filesystem::create_directories(settings.output_dir, ec);
  if (ec) {
    throw Error(
        "cannot create the output directory " + settings.output_dir.string() + ": " + ec.message(),
        "pass --output-dir with a writable directory");
  }
  if (settings.write_predictions) {
    io::writeFileAtomically(settings.output_dir / "generated_predictions.jsonl", [&](std::FILE* f) {
      for (const PredictionRow& row : rows) {
        const std::string line = predictionLine(row);
        std::fwrite(line.data(), 1, line.size(), f);
      }
    });
  }
  io::writeFileAtomically(settings.output_dir / "sample_scores.jsonl", [&](std::FILE* f) {
    for (size_t i = 0; i < scores.size(); ++i) {
      const std::string line = sampleScoresLine(indices[i], scores[i]);
      std::fwrite(line.data(), 1, line.size(), f);
    }
  });
  // HF Trainer.save_metrics: json.dump(metrics, indent=4, sort_keys=True).
  io::writeFileAtomically(settings.output_dir / "predict_results.json", results.dump(4) + "\n");
}

}  // namespace

double BatchEvalProgress::etaS() const {
  if (done <= 0) return 0;
  return elapsed_s / static_cast<double>(done) * static_cast<double>(total - done);
}

BatchEvalResult runBatchEval(int64_t total, const PredictFn& predict,
                             const BatchEvalSettings& settings,
                             const std::function<void(const BatchEvalProgress&)>& on_progress,
                             std::stop_token stop) {
  const JiebaSegmenter& jieba = JiebaSegmenter::shared(settings.jieba_dir);
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<PredictionRow> rows;
  std::vector<SampleScores> scores;
  std::vector<int64_t> indices;
  MetricsAccumulator accumulator;
  BatchEvalResult result;
  result.total = total;
  std::exception_ptr error;
  for (int64_t i = 0; i < total; ++i) {
    if (stop.stop_requested()) break;
    try {
      rows.push_back(predict(i, stop));
    } catch (const Cancelled&) {
      break;
    } catch (const Error& e) {
      if (result.first_failures.size() < PredictionsFile::kMaxReportedProblems) {
        result.first_failures.push_back({i + 1, e.message()});
      }
      ++result.failed;
      if (on_progress) on_progress({i + 1, total, elapsed()});
      continue;
    } catch (...) {
      error = std::current_exception();
      break;
    }
    indices.push_back(i);
    scores.push_back(scoreSample(jieba, rows.back(), settings.choice_letters));
    accumulator.add(scores.back());
    if (on_progress) on_progress({i + 1, total, elapsed()});
  }
  result.samples = static_cast<int64_t>(rows.size());
  result.stopped = result.samples + result.failed < total;
  result.runtime_s = elapsed();
  result.results = accumulator.results();
  // The HF Trainer's timing keys, and how many rows were asked for and skipped.
  result.results["predict_runtime"] = result.runtime_s;
  result.results["predict_samples_per_second"] =
      result.runtime_s > 0 ? static_cast<double>(result.samples) / result.runtime_s : 0.0;
  result.results["predict_samples_requested"] = total;
  result.results["predict_bad_rows"] = settings.bad_rows + result.failed;
  writeOutputs(settings, rows, scores, indices, result.results);
  if (error) std::rethrow_exception(error);
  return result;
}

}  // namespace tandem::eval
