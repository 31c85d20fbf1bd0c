#pragma once
// What a training run reports while it runs and when it ends: one event per optimizer step, the
// checkpoints and messages, the outcome. Plain structs without libtorch or Qt, so the trainer
// (engine/train), the run store (engine/store), the CLI and the studio's widgets share them as
// they are: the studio sends StepEvent through queued signals, the store records it.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/core/memory_snapshot.h"

namespace tandem {

struct StepEvent {
  int64_t step = 0;  // optimizer steps done
  int64_t total_steps = 0;
  double epoch = 0;  // fractional, as transformers logs it
  double loss = 0;   // mean over this step's kept tokens
  double learning_rate = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;  // non-padding tokens of this step / its wall time
  double elapsed_s = 0;
  double eta_s = 0;
  double step_s = 0;       // wall time of this step
  double model_s = 0;      // of which forward + backward (the model math)
  double optimizer_s = 0;  // of which grad clip + AdamW
  int world_size = 1;      // ranks of a data-parallel job (tokens_per_s counts them all)
  std::vector<DeviceMemoryUsage> memory;
};

class TrainListener {
 public:
  virtual ~TrainListener() = default;
  virtual void onStep(const StepEvent&) {}
  virtual void onCheckpoint(int64_t /*step*/, const std::filesystem::path&) {}
  virtual void onMessage(const std::string&) {}
  // The run waits at a step boundary (PauseGate), and goes on again.
  virtual void onPaused() {}
  virtual void onResumed() {}
  // Where the memory is: while the model loads and after every step (memory_snapshot.h). While
  // the model loads it comes from a sampling thread (runTraining), so it must be thread-safe.
  virtual void onMemory(const MemorySnapshot&) {}
};

enum class TrainOutcome { Completed, Stopped, Cancelled };

struct TrainResult {
  TrainOutcome outcome = TrainOutcome::Completed;
  int64_t steps = 0;
  double final_loss = 0;
};

}  // namespace tandem
