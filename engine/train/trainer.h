#pragma once
// The training loop: batching (padding or packing), gradient accumulation, one global grad-norm
// clip, AdamW with a warmup schedule, checkpoints that survive a kill, listener events.
// Deterministic for a seed: data order, LoRA init and dropout masks, also across a resume.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <stop_token>
#include <string>
#include <vector>

#include "engine/chat/supervised_encoder.h"
#include "engine/core/train_events.h"
#include "engine/gpu/lora_settings.h"
#include "engine/model/lora_training.h"
#include "engine/train/grad_norm_watch.h"
#include "engine/train/lr_schedule.h"
#include "engine/train/packing.h"

namespace tandem {
class PauseGate;
class ThreadPool;
}  // namespace tandem
namespace tandem::model {
class Model;
class ProcessGroup;
}  // namespace tandem::model

namespace tandem::train {

struct TrainerSettings {
  int64_t batch_size = 1;  // per_device_train_batch_size
  int64_t gradient_accumulation_steps = 1;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;  // > 0 wins over epochs, as in transformers
  LrSchedulerType schedule = LrSchedulerType::Linear;
  double learning_rate = 5e-5;
  int64_t warmup_steps = 0;
  double warmup_ratio = 0.0;
  double max_grad_norm = 1.0;
  model::AdamWSettings adamw;
  uint64_t seed = 42;
  // packing.h: rows of at most cutoff_len - 1 tokens, packed as LLaMA-Factory packs them;
  // neat_packing (implies packing) keeps the packed samples apart in attention and positions.
  bool packing = false;
  bool neat_packing = false;
  int64_t cutoff_len = 2048;
  int32_t pad_id = 0;
  int64_t logging_steps = 10;
  int64_t save_steps = 500;
  int64_t save_total_limit = 0;  // 0: keep all checkpoints
  std::filesystem::path output_dir;
  std::string base_model_name;     // written into adapter_config.json
  std::string config_fingerprint;  // written into each checkpoint
  // Evaluation on held-out samples (val_size / eval_dataset): every eval_steps optimizer steps,
  // and/or at each epoch end; 0 / false = never. The mean loss goes to the log as eval_loss.
  int64_t eval_steps = 0;
  bool eval_each_epoch = false;
  int64_t eval_batch_size = 8;
  // Data parallel (null: this process alone). Each rank trains on its batch_size rows of every
  // global micro-batch of batch_size x world size samples; gradients, loss and token counts are
  // summed over the ranks before the clip; rank 0 alone writes files. Not owned.
  model::ProcessGroup* group = nullptr;
  // Out of memory mid-run: what the planner says fits, for the error (placement::
  // outOfMemoryAdvice: the longest cutoff_len and what lengthens it); asked only then. May be null.
  std::function<std::string()> out_of_memory_advice;
};

// Seconds `steps_left` more steps take at the pace of this run's steps after its first: the
// first also packs the CPU experts, copies the resident ones to the GPU and warms the allocators
// (15 s of a 17 s first step on the 48-layer Qwen3 shape, where later steps take 0.9 s). With
// one step done, that step is all there is to go by.
double remainingSeconds(double elapsed_s, double first_step_s, int64_t steps_done,
                        int64_t steps_left);

// What ends or holds a run from outside: `stop` ends it at a step boundary with a checkpoint,
// `cancel` at the next micro-batch without one, and `pause` (may be null) holds it at a step
// boundary until resumed (stop and cancel still reach it there).
struct RunControl {
  std::stop_token stop;
  std::stop_token cancel;
  PauseGate* pause = nullptr;
};

class Trainer {
 public:
  Trainer(model::Model& model, const gpu::LoraSettings& lora,
          std::vector<chat::EncodedSample> samples, TrainerSettings settings, ThreadPool& pool,
          std::vector<chat::EncodedSample> eval_samples = {});

  // Mean loss over the held-out samples (no gradients); NaN without any.
  double evaluate();

  int64_t totalSteps() const { return total_steps_; }
  // What packing made of the samples (packing.h PackedRows::summary); empty without packing.
  const std::string& packingSummary() const { return packing_summary_; }
  int64_t stepsPerEpoch() const;

  // Continues from output_dir/checkpoint-N (adapter weights must already be in the model).
  // A checkpoint of a job with another world size keeps its global batch: gradient
  // accumulation adjusts, and the returned note says so (empty otherwise).
  std::string restore(const std::filesystem::path& checkpoint_dir);

  int worldSize() const;
  int rank() const;
  // Whether this process writes the log, checkpoints and the adapter (rank 0 of a job).
  bool writesFiles() const;

  // Runs to the end, or until `control` ends it (see RunControl).
  TrainResult run(const RunControl& control, TrainListener& listener);

  // Writes the final adapter and trainer_state.json into output_dir.
  void saveFinal(TrainListener& listener) const;
  std::filesystem::path saveCheckpoint() const;

 private:
  struct Batch {
    model::TokenBatch tokens;
    int64_t kept_tokens = 0;  // labels that count (after transformers' shift by one)
    int64_t real_tokens = 0;  // not padding
  };
  // The micro-batches of one optimizer step: a gradient accumulation window.
  struct Window {
    std::vector<Batch> batches;
    int64_t kept_tokens = 0;
    int64_t real_tokens = 0;
  };
  // What one step's math gave (loss over the window, seconds of forward + backward).
  struct StepMath {
    double loss = 0;
    double model_s = 0;
    bool cancelled = false;
  };
  // micro_batches_per_epoch_, total_steps_ and the schedule, from the settings and world size.
  void planSteps();
  std::vector<int64_t> epochOrder(int64_t epoch) const;
  Batch makeBatch(const std::vector<TrainingRow>& samples, const std::vector<int64_t>& order,
                  int64_t first, int64_t batch_size) const;
  Window nextWindow() const;
  StepMath accumulate(const Window& window, std::stop_token cancel, int64_t run_start_step);
  // Data parallel (trainer_data_parallel.cpp): the step's loss, real token count and gradients
  // summed over the ranks; stop / cancel agreed at a step boundary (any rank's request counts);
  // a checkpoint's global batch kept on another world size.
  void reduceOverRanks(StepMath& math, int64_t& real_tokens);
  void agreeOnControl(bool& stop, bool& cancel);
  std::string adoptGlobalBatch(const nlohmann::json& state, const std::filesystem::path& file,
                               int64_t& micro_done);
  // Clips, steps the optimizer and moves the data cursor on: the step's event, without timings.
  StepEvent optimizerStep(const Window& window, const StepMath& math);
  void logStep(const StepEvent& e);
  void afterStep(const StepEvent& e, TrainListener& listener);
  void waitIfPaused(const RunControl& control, TrainListener& listener);
  void logLine(nlohmann::json line);
  void writeCheckpointFiles(const std::filesystem::path& dir) const;
  void pruneCheckpoints() const;
  // A device (or the host) ran out of memory inside step step_ + 1: saves the state the step
  // started from (whole: the optimizer had not run) unless the run has no step of its own yet,
  // and throws an Error that says where it was saved and what to change.
  [[noreturn]] void failOutOfMemory(const std::string& what, int64_t run_start_step);
  // The loss or the gradients of step step_ + 1 are not finite: drops the gradients (the
  // optimizer has not run, the weights and the last checkpoint are as they were), logs it, and
  // throws an Error that says what to try.
  [[noreturn]] void failNotFinite(const std::string& what, double value);
  // A gradient norm far above the recent median: a warning in the log and to the listener.
  void warnIfSpike(const StepEvent& e, TrainListener& listener);

  model::Model& model_;
  gpu::LoraSettings lora_;
  std::string packing_summary_;
  std::vector<TrainingRow> samples_;  // packed rows with packing
  std::vector<TrainingRow> eval_samples_;
  TrainerSettings settings_;
  model::LoraTraining training_;
  LrSchedule schedule_;
  int64_t total_steps_ = 0;
  int64_t micro_batches_per_epoch_ = 0;
  // Position: optimizer steps done and micro-batches consumed (the data cursor).
  int64_t step_ = 0;
  int64_t micro_done_ = 0;
  std::vector<std::string> log_history_;  // JSON lines, also in trainer_state.json
  GradNormWatch grad_norms_;
};

}  // namespace tandem::train
