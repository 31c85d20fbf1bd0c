#include "engine/train/trainer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <span>

#include "engine/core/error.h"
#include "engine/core/pause_gate.h"
#include "engine/core/platform/durable_file.h"
#include "engine/core/platform/process_info.h"
#include "engine/core/units.h"
#include "engine/io/atomic_file.h"
#include "engine/io/bounded_json.h"
#include "engine/model/adapter_files.h"
#include "engine/model/checkpoint_dir.h"
#include "engine/train/memory_sampling.h"

namespace tandem::train {

namespace {

// The training rows: the samples as they are, or packed (packing.h).
std::vector<TrainingRow> trainingRows(std::vector<chat::EncodedSample> samples,
                                      const TrainerSettings& settings, std::string& summary) {
  if (!settings.packing && !settings.neat_packing) return unpackedRows(std::move(samples));
  PackedRows packed = packForTraining(
      samples, settings.cutoff_len, settings.neat_packing ? PackingMode::Neat : PackingMode::Plain);
  summary = (settings.neat_packing ? "neat packing: " : "packing: ") + packed.summary();
  return std::move(packed.rows);
}

// One write: a line is added whole or (after a crash) the file ends with a partial line, which the
// next run's rewrite from the checkpoint's history removes.
void appendLine(const std::filesystem::path& path, const std::string& line) {
  const std::error_code error = platform::appendInOneWrite(path, line + "\n");
  if (error == std::errc::io_error) {  // a short write
    throw Error("cannot append to " + path.string() + " (disk full?)",
                "free disk space and resume the run");
  }
  if (error) throw Error("cannot append to " + path.string() + ": " + error.message());
}

Error badState(const std::filesystem::path& file, const std::string& problem) {
  return Error(file.string() + " " + problem,
               "delete " + file.parent_path().string() +
                   " (the run resumes from the checkpoint before it), or start over with "
                   "overwrite_output_dir: true");
}

// A count a checkpoint's trainer_state.json must hold: present, an integer, not negative.
int64_t stateCount(const nlohmann::json& state, const char* field,
                   const std::filesystem::path& file) {
  const auto it = state.find(field);
  if (it == state.end()) throw badState(file, std::string("has no \"") + field + "\"");
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    throw badState(file, std::string("has \"") + field +
                             "\": " + io::excerptForMessage(it->dump()) + ", not a count");
  return it->get<int64_t>();
}

// The log history as JSON values, from the lines this trainer wrote (so always valid JSON).
nlohmann::json historyJson(const std::vector<std::string>& lines) {
  nlohmann::json history = nlohmann::json::array();
  for (const std::string& l : lines)
    history.push_back(io::parseBoundedJson(l, io::kStateJsonLimits, "trainer_log.jsonl line"));
  return history;
}

}  // namespace

Trainer::Trainer(model::Model& model, const gpu::LoraSettings& lora,
                 std::vector<chat::EncodedSample> samples, TrainerSettings settings,
                 ThreadPool& pool, std::vector<chat::EncodedSample> eval_samples)
    : model_(model),
      lora_(lora),
      samples_(trainingRows(std::move(samples), settings, packing_summary_)),
      // Held-out samples are evaluated one by one: with neat packing that is the same loss.
      eval_samples_(unpackedRows(std::move(eval_samples))),
      settings_(std::move(settings)),
      training_(model, settings_.adamw, pool) {
  if (samples_.empty()) throw Error("no training samples", "check the dataset and cutoff_len");
  settings_.batch_size = std::max<int64_t>(1, settings_.batch_size);
  settings_.gradient_accumulation_steps =
      std::max<int64_t>(1, settings_.gradient_accumulation_steps);
  planSteps();
  model::LoraTraining::seedDropout(settings_.seed);
}

void Trainer::planSteps() {
  // A micro-batch is global: batch_size rows on each rank.
  const int64_t global_micro = settings_.batch_size * worldSize();
  micro_batches_per_epoch_ =
      (static_cast<int64_t>(samples_.size()) + global_micro - 1) / global_micro;
  // The config refuses such values (train_config.cpp); settings from elsewhere are checked here,
  // before a double too large for int64 is converted (undefined behaviour).
  const double epoch_steps = settings_.num_train_epochs * static_cast<double>(stepsPerEpoch());
  if (settings_.max_steps <= 0 && !(epoch_steps > 0 && epoch_steps <= 1e12)) {
    throw Error("num_train_epochs " + std::to_string(settings_.num_train_epochs) +
                    " gives no step count Tandem can run",
                "set num_train_epochs in (0, 1000000], or max_steps");
  }
  total_steps_ =
      settings_.max_steps > 0
          ? settings_.max_steps
          : static_cast<int64_t>(std::ceil(settings_.num_train_epochs * stepsPerEpoch()));
  total_steps_ = std::max<int64_t>(1, total_steps_);
  schedule_.type = settings_.schedule;
  schedule_.base_lr = settings_.learning_rate;
  schedule_.total_steps = total_steps_;
  schedule_.warmup_steps =
      warmupSteps(settings_.warmup_steps, settings_.warmup_ratio, total_steps_);
}

int64_t Trainer::stepsPerEpoch() const {
  return (micro_batches_per_epoch_ + settings_.gradient_accumulation_steps - 1) /
         settings_.gradient_accumulation_steps;
}

// A fixed permutation per (seed, epoch): a resumed run sees the same order. Fisher-Yates with
// mt19937_64, whose output the C++ standard fixes (std::shuffle's use of it is not fixed).
std::vector<int64_t> Trainer::epochOrder(int64_t epoch) const {
  std::vector<int64_t> order(samples_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::mt19937_64 rng(settings_.seed * 1000003ull + static_cast<uint64_t>(epoch));
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  return order;
}

Trainer::Batch Trainer::makeBatch(const std::vector<TrainingRow>& samples,
                                  const std::vector<int64_t>& order, int64_t first,
                                  int64_t batch_size) const {
  // A rank's share of an epoch's last global micro-batch can be short or empty.
  const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(order.size()) - first, 0, batch_size);
  const std::span<const int64_t> rows =
      n > 0 ? std::span<const int64_t>(order.data() + first, static_cast<size_t>(n))
            : std::span<const int64_t>();
  Batch b;
  b.tokens = batchOfRows(samples, rows, settings_.pad_id);
  for (int64_t i : rows) {
    b.real_tokens += static_cast<int64_t>(samples[i].input_ids.size());
    b.kept_tokens += keptTokens(samples[i]);
  }
  return b;
}

void Trainer::logLine(nlohmann::json line) {
  log_history_.push_back(line.dump());
  if (writesFiles()) appendLine(settings_.output_dir / "trainer_log.jsonl", log_history_.back());
}

double Trainer::evaluate() {
  if (eval_samples_.empty()) return std::nan("");
  std::vector<int64_t> order(eval_samples_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  const int64_t batch_size = std::max<int64_t>(1, settings_.eval_batch_size);
  double loss_sum = 0;
  int64_t kept = 0;
  for (int64_t first = 0; first < static_cast<int64_t>(order.size()); first += batch_size) {
    const Batch b = makeBatch(eval_samples_, order, first, batch_size);
    if (b.kept_tokens == 0) continue;
    loss_sum += training_.evaluateLoss(b.tokens) * static_cast<double>(b.kept_tokens);
    kept += b.kept_tokens;
  }
  return kept > 0 ? loss_sum / static_cast<double>(kept) : std::nan("");
}

double remainingSeconds(double elapsed_s, double first_step_s, int64_t steps_done,
                        int64_t steps_left) {
  if (steps_done <= 0 || steps_left <= 0) return 0;
  const double per_step = steps_done == 1
                              ? elapsed_s
                              : (elapsed_s - first_step_s) / static_cast<double>(steps_done - 1);
  return std::max(0.0, per_step) * static_cast<double>(steps_left);
}

Trainer::Window Trainer::nextWindow() const {
  const int64_t epoch = micro_done_ / micro_batches_per_epoch_;
  const int64_t in_epoch = micro_done_ % micro_batches_per_epoch_;
  const int64_t n_micro =
      std::min(settings_.gradient_accumulation_steps, micro_batches_per_epoch_ - in_epoch);
  const std::vector<int64_t> order = epochOrder(epoch);
  // Data parallel: global micro-batch m holds samples [m * B * W, (m + 1) * B * W) of the epoch's
  // order, the same rows a one-process run with batch B * W takes; rank r trains on its r-th
  // B of them. The window's kept-token count (the loss's denominator) is over every rank's rows:
  // each rank counts them itself, since every rank holds the whole dataset.
  const int64_t global_micro = settings_.batch_size * worldSize();
  const int64_t rank_offset = settings_.batch_size * rank();
  Window window;
  for (int64_t m = 0; m < n_micro; ++m) {
    const int64_t first = (in_epoch + m) * global_micro;
    window.batches.push_back(makeBatch(samples_, order, first + rank_offset, settings_.batch_size));
    const int64_t end = std::min<int64_t>(first + global_micro, static_cast<int64_t>(order.size()));
    for (int64_t i = first; i < end; ++i) window.kept_tokens += keptTokens(samples_[order[i]]);
    window.real_tokens += window.batches.back().real_tokens;
  }
  return window;
}

Trainer::StepMath Trainer::accumulate(const Window& window, std::stop_token cancel,
                                      int64_t run_start_step) {
  using Clock = std::chrono::steady_clock;
  StepMath math;
  try {
    for (const Batch& b : window.batches) {
      if (cancel.stop_requested()) {
        math.cancelled = true;
        return math;
      }
      if (b.kept_tokens == 0) continue;
      const auto start = Clock::now();
      // Each micro-batch's mean scaled to its share of the window: the step's loss is the mean
      // over every kept token of the accumulated batch, however the tokens fell into batches.
      math.loss += training_.accumulateGradients(
          b.tokens, static_cast<double>(b.kept_tokens) / static_cast<double>(window.kept_tokens));
      math.model_s += std::chrono::duration<double>(Clock::now() - start).count();
    }
  } catch (const OutOfMemory& e) {
    failOutOfMemory(e.message(), run_start_step);
  }
  return math;
}

StepEvent Trainer::optimizerStep(const Window& window, const StepMath& math) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  StepEvent e;
  e.learning_rate = schedule_.at(step_);
  if (!std::isfinite(math.loss)) failNotFinite("the loss", math.loss);
  e.grad_norm = training_.clipGradNorm(settings_.max_grad_norm);
  // Checked before the update: one inf or NaN gradient would make every weight NaN.
  if (!std::isfinite(e.grad_norm)) failNotFinite("the gradient norm", e.grad_norm);
  training_.step(e.learning_rate);
  training_.zeroGrad();
  e.optimizer_s = std::chrono::duration<double>(Clock::now() - start).count();
  ++step_;
  micro_done_ += static_cast<int64_t>(window.batches.size());
  e.step = step_;
  e.total_steps = total_steps_;
  e.epoch = static_cast<double>(micro_done_) / static_cast<double>(micro_batches_per_epoch_);
  e.loss = math.loss;
  e.model_s = math.model_s;
  e.world_size = worldSize();
  return e;
}

void Trainer::logStep(const StepEvent& e) {
  if (step_ % std::max<int64_t>(1, settings_.logging_steps) != 0 && step_ != total_steps_) return;
  logLine({{"current_steps", step_},
           {"total_steps", total_steps_},
           {"loss", e.loss},
           {"lr", e.learning_rate},
           {"grad_norm", e.grad_norm},
           {"epoch", e.epoch},
           {"percentage", std::round(10000.0 * step_ / total_steps_) / 100.0},
           {"elapsed_time", formatDuration(e.elapsed_s)},
           {"remaining_time", formatDuration(e.eta_s)},
           {"tokens_per_s", e.tokens_per_s},
           {"step_s", e.step_s},
           {"model_s", e.model_s},
           {"optimizer_s", e.optimizer_s}});
}

// Evaluation and checkpoints, on their schedules.
void Trainer::afterStep(const StepEvent& e, TrainListener& listener) {
  const bool epoch_ended = micro_done_ % micro_batches_per_epoch_ == 0;
  if (!eval_samples_.empty() && ((settings_.eval_steps > 0 && step_ % settings_.eval_steps == 0) ||
                                 (settings_.eval_each_epoch && epoch_ended))) {
    const double eval_loss = evaluate();
    logLine({{"current_steps", step_},
             {"total_steps", total_steps_},
             {"eval_loss", eval_loss},
             {"epoch", e.epoch}});
    char text[96];
    std::snprintf(text, sizeof text, "eval at step %lld: loss %.4f on %zu samples",
                  static_cast<long long>(step_), eval_loss, eval_samples_.size());
    listener.onMessage(text);
  }
  if (settings_.save_steps > 0 && step_ % settings_.save_steps == 0 && step_ < total_steps_) {
    const std::filesystem::path dir = saveCheckpoint();
    if (writesFiles()) listener.onCheckpoint(step_, dir);
  }
}

void Trainer::waitIfPaused(const RunControl& control, TrainListener& listener) {
  if (!control.pause || !control.pause->paused()) return;
  listener.onPaused();
  control.pause->wait(control.stop, control.cancel);
  listener.onResumed();
}

TrainResult Trainer::run(const RunControl& control, TrainListener& listener) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const int64_t start_step = step_;
  double first_step_s = 0;  // elapsed at the end of this run's first step
  StepMemorySampler memory_sampler;
  TrainResult result;
  // The log's first line may come first.
  if (writesFiles()) std::filesystem::create_directories(settings_.output_dir);
  while (step_ < total_steps_) {
    waitIfPaused(control, listener);
    bool stop = control.stop.stop_requested(), cancel = control.cancel.stop_requested();
    if (settings_.group) agreeOnControl(stop, cancel);
    if (cancel) {
      result.outcome = TrainOutcome::Cancelled;
      break;
    }
    if (stop) {
      saveCheckpoint();
      listener.onMessage("stopped at step " + std::to_string(step_) + " with a checkpoint");
      result.outcome = TrainOutcome::Stopped;
      break;
    }
    const auto step_start = Clock::now();
    const Window window = nextWindow();
    // Data parallel: cancel waits for the step boundary, where the ranks agree on it.
    StepMath math =
        accumulate(window, settings_.group ? std::stop_token() : control.cancel, start_step);
    int64_t real_tokens = window.real_tokens;
    if (settings_.group) reduceOverRanks(math, real_tokens);
    if (math.cancelled) {
      training_.zeroGrad();
      result.outcome = TrainOutcome::Cancelled;
      break;
    }
    StepEvent e = optimizerStep(window, math);
    e.step_s = std::chrono::duration<double>(Clock::now() - step_start).count();
    e.tokens_per_s = e.step_s > 0 ? static_cast<double>(real_tokens) / e.step_s : 0;
    e.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    if (step_ == start_step + 1) first_step_s = e.elapsed_s;
    e.eta_s = remainingSeconds(e.elapsed_s, first_step_s, step_ - start_step, total_steps_ - step_);
    e.memory = MemoryLedger::global().snapshot();
    result.final_loss = e.loss;
    logStep(e);
    warnIfSpike(e, listener);
    listener.onStep(e);
    memory_sampler.afterStep(listener, step_, step_ == start_step + 1 || step_ == total_steps_);
    afterStep(e, listener);
  }
  result.steps = step_;
  return result;
}

void Trainer::failOutOfMemory(const std::string& what, int64_t run_start_step) {
  training_.zeroGrad();  // the failed step's partial gradients
  const std::string failed_step = std::to_string(step_ + 1);
  std::string saved = "no step finished in this run, so there is nothing new to save";
  if (step_ > run_start_step) {
    try {
      saved = "step " + std::to_string(step_) + " is saved in " + saveCheckpoint().string();
    } catch (const std::exception& e) {
      saved = "saving step " + std::to_string(step_) + " failed too (" + e.what() + ")";
    }
  }
  // The planner's longest cutoff_len for the settings that ran, and what lengthens it.
  std::string fits;
  if (settings_.out_of_memory_advice) {
    try {
      fits = settings_.out_of_memory_advice() + ". ";
    } catch (const std::exception& e) {
      fits = std::string("(the planner could not say what fits: ") + e.what() + ") ";
    }
  }
  throw Error(
      "out of memory in training step " + failed_step + ": " + what.substr(0, what.find('\n')),
      saved + ". " + fits +
          "Run the same YAML with a smaller gpu_experts (a count instead of auto) to "
          "resume from there, or start over with a lower cutoff_len or "
          "per_device_train_batch_size, "
          "or with gradient_checkpointing: true; `tandem plan` with the YAML shows what each "
          "takes");
}

void Trainer::failNotFinite(const std::string& what, double value) {
  training_.zeroGrad();
  const std::string failed_step = std::to_string(step_ + 1);
  const std::filesystem::path last = model::lastCheckpoint(settings_.output_dir);
  const std::string message = "training diverged in step " + failed_step + ": " + what + " is " +
                              std::to_string(value) +
                              "; the step was not applied (no weight was updated)";
  try {
    logLine({{"current_steps", step_ + 1}, {"total_steps", total_steps_}, {"error", message}});
  } catch (const Error&) {
    // The log is a record; failing to write it must not hide the divergence itself.
  }
  char advice[320];
  std::snprintf(advice, sizeof advice,
                ". Try a lower learning_rate (now %g), training in fp32 (bf16: false) instead of "
                "bf16, or %s (changed settings start the run over: overwrite_output_dir: true, "
                "or another output_dir)",
                settings_.learning_rate,
                settings_.max_grad_norm > 0 ? "a lower max_grad_norm" : "max_grad_norm: 1.0");
  throw Error(message, (last.empty() ? std::string("no checkpoint was saved before it")
                                     : "the last checkpoint, " + last.string() + ", is intact") +
                           advice);
}

void Trainer::warnIfSpike(const StepEvent& e, TrainListener& listener) {
  const std::optional<double> median = grad_norms_.observe(e.grad_norm);
  if (!median) return;
  char text[200];
  std::snprintf(text, sizeof text,
                "warning: step %lld's gradient norm %.4g is %.0fx the median of recent steps "
                "(%.4g); if the loss jumps, lower learning_rate or max_grad_norm",
                static_cast<long long>(step_), e.grad_norm, e.grad_norm / *median, *median);
  logLine({{"current_steps", step_},
           {"total_steps", total_steps_},
           {"warning", text},
           {"grad_norm", e.grad_norm}});
  listener.onMessage(text);
}

void Trainer::writeCheckpointFiles(const std::filesystem::path& dir) const {
  model::writeAdapter(model_, lora_, dir, model::ExpertAdapterForm::Fused,
                      settings_.base_model_name);
  training_.saveState(dir / "optimizer.safetensors");
  const nlohmann::json history = historyJson(log_history_);
  const nlohmann::json trainer_state = {
      {"global_step", step_},
      {"max_steps", total_steps_},
      {"epoch", static_cast<double>(micro_done_) / static_cast<double>(micro_batches_per_epoch_)},
      {"micro_batches_done", micro_done_},
      {"optimizer_steps", training_.stepCount()},
      {"num_train_epochs", settings_.num_train_epochs},
      {"train_batch_size", settings_.batch_size},
      {"gradient_accumulation_steps", settings_.gradient_accumulation_steps},
      {"world_size", worldSize()},
      {"seed", settings_.seed},
      {"config_fingerprint", settings_.config_fingerprint},
      {"log_history", history}};
  // Written last: its presence marks the checkpoint complete.
  io::writeFileAtomically(dir / "trainer_state.json", trainer_state.dump(2) + "\n");
}

std::filesystem::path Trainer::saveCheckpoint() const {
  namespace fs = std::filesystem;
  const fs::path final_dir = settings_.output_dir / ("checkpoint-" + std::to_string(step_));
  if (!writesFiles()) return final_dir;  // rank 0 writes it
  const fs::path tmp_dir =
      settings_.output_dir / (".checkpoint-" + std::to_string(step_) + ".tmp-" +
                              std::to_string(platform::currentProcessId()));
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  try {
    writeCheckpointFiles(tmp_dir);
    fs::remove_all(final_dir);
    fs::rename(tmp_dir, final_dir);  // a directory appears complete or not at all
  } catch (...) {
    std::error_code ignored;  // the save's own error is the one to report
    fs::remove_all(tmp_dir, ignored);
    throw;
  }
  pruneCheckpoints();
  return final_dir;
}

void Trainer::pruneCheckpoints() const {
  if (settings_.save_total_limit <= 0) return;
  std::vector<std::pair<int64_t, std::filesystem::path>> found;
  for (const auto& entry : std::filesystem::directory_iterator(settings_.output_dir)) {
    if (const auto step = model::checkpointStep(entry.path()); entry.is_directory() && step) {
      found.emplace_back(*step, entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  for (size_t i = 0; i + settings_.save_total_limit < found.size(); ++i) {
    std::filesystem::remove_all(found[i].second);
  }
}

void Trainer::saveFinal(TrainListener& listener) const {
  if (!writesFiles()) return;
  model::writeAdapter(model_, lora_, settings_.output_dir, model::ExpertAdapterForm::Fused,
                      settings_.base_model_name);
  const nlohmann::json history = historyJson(log_history_);
  io::writeFileAtomically(
      settings_.output_dir / "trainer_state.json",
      nlohmann::json(
          {{"global_step", step_}, {"max_steps", total_steps_}, {"log_history", history}})
              .dump(2) +
          "\n");
  listener.onMessage("adapter written to " + settings_.output_dir.string());
}

std::string Trainer::restore(const std::filesystem::path& checkpoint_dir) {
  const std::filesystem::path file = checkpoint_dir / "trainer_state.json";
  const nlohmann::json state = io::readBoundedJsonFile(file, io::kStateJsonLimits);
  if (!state.is_object()) throw badState(file, "is not a JSON object");
  if (state.value("config_fingerprint", std::string()) != settings_.config_fingerprint) {
    throw Error(checkpoint_dir.string() + " was written by a different configuration",
                "set overwrite_output_dir: true, or use another output_dir");
  }
  // Everything is read and checked before the trainer takes any of it.
  const int64_t step = stateCount(state, "global_step", file);
  int64_t micro_done = stateCount(state, "micro_batches_done", file);
  const std::string note = adoptGlobalBatch(state, file, micro_done);
  const int64_t optimizer_steps = stateCount(state, "optimizer_steps", file);
  if (step > total_steps_) {
    throw badState(file, "has \"global_step\": " + std::to_string(step) + ", past this run's " +
                             std::to_string(total_steps_) + " steps");
  }
  const auto history = state.find("log_history");
  if (history == state.end() || !history->is_array())
    throw badState(file, "has no \"log_history\" list");
  step_ = step;
  micro_done_ = micro_done;
  log_history_.clear();
  for (const auto& line : *history) log_history_.push_back(line.dump());
  // Lines the interrupted run logged after this checkpoint are dropped: they will be redone.
  std::string all;
  for (const std::string& l : log_history_) all += l + "\n";
  if (writesFiles()) io::writeFileAtomically(settings_.output_dir / "trainer_log.jsonl", all);
  training_.loadState(checkpoint_dir / "optimizer.safetensors", optimizer_steps);
  return note;
}

}  // namespace tandem::train
