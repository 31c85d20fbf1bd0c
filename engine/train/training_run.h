#pragma once
// One fine-tuning run from a TrainConfig, end to end: tokenizer, template and data (all
// validated before anything is written), the model with its adapter, the output dir (refused
// when it holds another config's run, resumed from its last checkpoint when it holds this one),
// the trainer, the final adapter, and the run store. What `tandem train`, the demo and the
// studio's training controller call.

#include <cstdint>
#include <filesystem>
#include <stop_token>
#include <string>

#include "engine/model/model.h"
#include "engine/train/train_config.h"
#include "engine/train/trainer.h"

namespace tandem::store {
class RunStore;
}

namespace tandem::train {

struct TrainingRunOutcome {
  TrainResult result;
  int64_t run_id = 0;  // in the run store, 0 without a store
  std::filesystem::path output_dir;
  bool resumed = false;
  int64_t resumed_from_step = 0;
  model::AppliedPlacement applied_placement;  // where the model's parts ran
};

// Runs the whole job on the calling thread (callers put it on their own thread), on the
// placement the memory planner judged for this machine (model_resolver.h). `control` stops,
// cancels or pauses it (trainer.h: RunControl). Errors are tandem::Error; the store records the
// run's status (and its pauses) either way. `store` may be null.
TrainingRunOutcome runTraining(const TrainConfig& config, TrainListener& listener,
                               const RunControl& control, store::RunStore* store);

}  // namespace tandem::train
