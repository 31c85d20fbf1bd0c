// `tandem eval`: batch predictions over a dataset and LLaMA-Factory's metrics (BLEU, ROUGE with
// jieba, multiple-choice accuracy), written as generated_predictions.jsonl + predict_results.json
// and recorded in the run store. `--predictions FILE` scores an existing predictions file.
// The work runs on its own thread; Ctrl-C stops it and writes what is done (docs/eval.md).

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <optional>
#include <thread>

#include "app/cli/commands.h"
#include "app/cli/eval_generate.h"
#include "app/cli/model_options.h"
#include "engine/core/error.h"
#include "engine/core/install_layout.h"
#include "engine/core/platform/interrupt.h"
#include "engine/eval/batch_eval.h"
#include "engine/store/run_store.h"

namespace tandem::cli {

namespace {

namespace fs = std::filesystem;

std::atomic<int> g_interrupts{0};
void onEvalInterrupt() { g_interrupts.fetch_add(1); }

struct EvalOptions {
  std::string predictions;  // scoring mode when set
  GenerateEvalOptions generate;
  std::string output_dir;
  std::string choices;
  std::string db;
  bool no_store = false;
};

std::string formatDuration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  } else {
    std::snprintf(text, sizeof(text), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return text;
}

void printProgress(const eval::BatchEvalProgress& p) {
  std::fprintf(stderr, "\r[eval] %lld/%lld samples  %.2f samples/s  ETA %s   ",
               static_cast<long long>(p.done), static_cast<long long>(p.total), p.samplesPerS(),
               formatDuration(p.etaS()).c_str());
  std::fflush(stderr);
}

void reportBadRows(int64_t bad_rows, const std::vector<eval::BadRow>& problems,
                   const std::string& file) {
  if (bad_rows == 0) return;
  std::fprintf(stderr, "warning: %s: %lld bad rows skipped\n", file.c_str(),
               static_cast<long long>(bad_rows));
  for (const eval::BadRow& problem : problems) {
    std::fprintf(stderr, "  line %lld: %s\n", static_cast<long long>(problem.line),
                 problem.reason.c_str());
  }
}

// Runs the evaluation on a worker thread so that Ctrl-C (first: stop and write what is done)
// is handled here while a generation is in flight.
eval::BatchEvalResult runInForeground(int64_t total, const eval::PredictFn& predict,
                                      const eval::BatchEvalSettings& settings) {
  std::stop_source stop;
  std::exception_ptr error;
  eval::BatchEvalResult result;
  std::atomic<bool> done{false};
  g_interrupts.store(0);
  std::optional<platform::ScopedInterruptHandler> interrupt;
  interrupt.emplace(onEvalInterrupt, platform::InterruptKinds::CtrlCAndTerminate);
  std::jthread job([&] {
    try {
      result = eval::runBatchEval(total, predict, settings, printProgress, stop.get_token());
    } catch (...) {
      error = std::current_exception();
    }
    done.store(true);
  });
  bool stopping = false;
  while (!done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!stopping && g_interrupts.load() > 0) {
      stopping = true;
      std::fprintf(stderr, "\nstopping: writing the samples done so far\n");
      stop.request_stop();
    }
  }
  job.join();
  interrupt.reset();
  std::fprintf(stderr, "\n");
  if (error) std::rethrow_exception(error);
  return result;
}

// The evaluation as a run of kind eval: created (running) before the first sample, so that
// `tandem runs` shows it live and its duration; at the end its one step row holds the scores
// (extra_json), the step being the number of samples scored.
class EvalRunRecord {
 public:
  EvalRunRecord(const EvalOptions& options, const std::string& model, const std::string& dataset,
                int64_t total) {
    if (options.no_store) return;
    store_.emplace(store::RunStore::open(options.db.empty() ? store::RunStore::defaultPath()
                                                            : fs::path(options.db)));
    store::NewRun run;
    run.kind = store::RunKind::Eval;
    run.name = "eval " + fs::path(dataset).filename().string();
    run.model = model;
    run.dataset = dataset;
    run.output_dir = fs::absolute(options.output_dir);
    run.total_steps = total;
    id_ = store_->createRun(run);
  }

  void finish(const eval::BatchEvalResult& result) {
    if (!store_) return;
    store::StepMetrics metrics;
    metrics.step = result.samples;
    metrics.loss = std::nan("");  // stored as NULL: an evaluation has no training loss
    metrics.elapsed_s = result.runtime_s;
    metrics.extra_json = result.results.dump();
    store_->recordStep(id_, metrics);
    store_->setStatus(id_,
                      result.stopped ? store::RunStatus::Stopped : store::RunStatus::Completed);
  }

  void fail(const std::string& error) {
    if (store_) store_->setStatus(id_, store::RunStatus::Failed, error);
  }

 private:
  std::optional<store::RunStore> store_;
  int64_t id_ = 0;
};

eval::BatchEvalResult runRecorded(EvalRunRecord& record, int64_t total,
                                  const eval::PredictFn& predict,
                                  const eval::BatchEvalSettings& settings) {
  try {
    eval::BatchEvalResult result = runInForeground(total, predict, settings);
    record.finish(result);
    return result;
  } catch (const std::exception& e) {
    record.fail(e.what());
    throw;
  }
}

void printResults(const eval::BatchEvalResult& result, const fs::path& output_dir) {
  if (result.failed > 0) {
    std::fprintf(stderr, "warning: %lld samples could not be answered and were skipped\n",
                 static_cast<long long>(result.failed));
    for (const eval::BadRow& failure : result.first_failures) {
      std::fprintf(stderr, "  sample %lld: %s\n", static_cast<long long>(failure.line),
                   failure.reason.c_str());
    }
  }
  if (result.stopped) {
    std::printf("stopped after %lld of %lld samples\n", static_cast<long long>(result.samples),
                static_cast<long long>(result.total));
  }
  for (const char* key :
       {"predict_bleu-1", "predict_bleu-2", "predict_bleu-3", "predict_bleu-4", "predict_rouge-1",
        "predict_rouge-2", "predict_rouge-l", "predict_accuracy"}) {
    if (result.results.contains(key))
      std::printf("  %-18s %.4f\n", key, result.results[key].get<double>());
  }
  std::printf("results: %s\n", (output_dir / "predict_results.json").string().c_str());
}

void checkChoices(const std::string& choices) {
  for (const char c : choices) {
    if (c < 'A' || c > 'Z' || choices.find(c) != choices.rfind(c)) {
      throw Error("--choices \"" + choices + "\" must be distinct capital letters",
                  "e.g. --choices ABCD");
    }
  }
}

void scorePredictionsFile(EvalOptions options) {
  const eval::PredictionsFile file = eval::readPredictions(options.predictions);
  reportBadRows(file.bad_rows, file.first_problems, options.predictions);
  if (file.rows.empty()) {
    throw Error("no usable prediction in " + options.predictions,
                "each line must be a JSON object with string \"predict\" and \"label\" fields");
  }
  if (options.output_dir.empty())
    options.output_dir = fs::path(options.predictions).parent_path().string();
  if (options.output_dir.empty()) options.output_dir = ".";
  eval::BatchEvalSettings settings;
  settings.output_dir = options.output_dir;
  settings.jieba_dir = resourcesDir() / "jieba";
  settings.choice_letters = options.choices;
  settings.write_predictions = false;
  settings.bad_rows = file.bad_rows;
  const auto predict = [&](int64_t index, std::stop_token) {
    return file.rows[static_cast<size_t>(index)];
  };
  const auto total = static_cast<int64_t>(file.rows.size());
  EvalRunRecord record(options, "", options.predictions, total);
  const eval::BatchEvalResult result = runRecorded(record, total, predict, settings);
  printResults(result, options.output_dir);
}

void generateAndScore(EvalOptions options) {
  if (options.output_dir.empty()) {
    throw Error("--output-dir is required with --model",
                "name the folder for generated_predictions.jsonl");
  }
  PreparedEval prepared = prepareGenerateEval(options.generate);
  reportBadRows(prepared.bad_rows, prepared.first_problems, options.generate.dataset);
  eval::BatchEvalSettings settings;
  settings.output_dir = options.output_dir;
  settings.jieba_dir = resourcesDir() / "jieba";
  settings.choice_letters = options.choices;
  settings.bad_rows = prepared.bad_rows;
  EvalRunRecord record(options, options.generate.model, options.generate.dataset, prepared.samples);
  const eval::BatchEvalResult result =
      runRecorded(record, prepared.samples, prepared.predict, settings);
  std::printf("predictions: %s\n",
              (fs::path(options.output_dir) / "generated_predictions.jsonl").string().c_str());
  printResults(result, options.output_dir);
}

}  // namespace

void addEvalCommand(CLI::App& app) {
  auto* command = app.add_subcommand("eval",
                                     "Generate answers for a dataset and score them (BLEU, ROUGE, "
                                     "choice accuracy) like LLaMA-Factory");
  auto options = std::make_shared<EvalOptions>();
  GenerateEvalOptions& g = options->generate;
  auto* predictions =
      command->add_option("--predictions", options->predictions,
                          "score this generated_predictions.jsonl instead of generating");
  auto* model =
      command->add_option("--model", g.model, "model dir (config.json, safetensors, tokenizer)");
  predictions->excludes(model);
  command
      ->add_option("--adapter", g.adapter,
                   "LoRA adapter dir (PEFT, or a Tandem output/checkpoint dir)")
      ->needs(model);
  auto* dataset =
      command->add_option("--dataset", g.dataset, "dataset name(s) in dataset_info.json, or a file")
          ->needs(model);
  model->needs(dataset);
  command->add_option("--dataset-dir", g.dataset_dir, "folder with dataset_info.json")
      ->capture_default_str();
  command->add_option("--template", g.generator.template_name,
                      "chat template (default: from the model type)");
  command->add_option("--max-samples", g.max_samples, "use the first N samples of each dataset");
  command->add_option("--output-dir", options->output_dir,
                      "where the results go (default with --predictions: beside the file)");
  command->add_option("--max-new-tokens", g.settings.max_new_tokens, "answer length limit")
      ->capture_default_str();
  command->add_flag(
      "--do-sample", g.settings.do_sample,
      "sample (temperature, top-p, top-k) instead of decoding greedily, eval's default");
  command->add_option("--temperature", g.settings.temperature, "sampling temperature")
      ->capture_default_str();
  command->add_option("--top-p", g.settings.top_p, "nucleus sampling")->capture_default_str();
  command->add_option("--top-k", g.settings.top_k, "top-k sampling (0: off)")
      ->capture_default_str();
  command->add_option("--repetition-penalty", g.settings.repetition_penalty, "1.0: off")
      ->capture_default_str();
  command->add_option("--seed", g.seed, "sampling seed");
  addModelOptions(*command, g.generator);
  command->add_option("--choices", options->choices,
                      "score multiple-choice accuracy with these answer letters, e.g. ABCD");
  command->add_option(
      "--db", options->db,
      "run store database (default: $TANDEM_HOME/runs.db, else ~/.local/share/tandem/runs.db)");
  command->add_flag("--no-store", options->no_store,
                    "do not record the evaluation in the run store");
  command->callback([options] {
    checkChoices(options->choices);
    if (!options->predictions.empty()) {
      scorePredictionsFile(*options);
    } else if (!options->generate.model.empty()) {
      generateAndScore(*options);
    } else {
      throw Error("nothing to evaluate", "pass --model DIR --dataset NAME, or --predictions FILE");
    }
  });
}

}  // namespace tandem::cli
