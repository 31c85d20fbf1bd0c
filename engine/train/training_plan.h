#pragma once
// The memory plan of a training config, before anything is loaded: the LLaMA-Factory settings
// (lora_rank, lora_target, cutoff_len, batch, gradient checkpointing, bf16, the experts backend)
// turned into a placement::PlanRequest, and kt_optimize_rule's placement when the config names a
// rule file. `tandem plan` prints it; runTraining refuses early when it does not fit.

#include <filesystem>

#include "engine/io/model_config.h"
#include "engine/placement/hardware.h"
#include "engine/placement/memory_planner.h"
#include "engine/train/train_config.h"

namespace tandem::train {

placement::PlanRequest planRequestFor(const TrainConfig& config, const io::ModelConfig& model);

// planMemory, or evaluatePlacement of kt_optimize_rule's placement (a KT rule file or a
// presets/placement file, relative to the working directory as LLaMA-Factory resolves it).
placement::MemoryPlan planTraining(const TrainConfig& config, const io::ModelConfig& model,
                                   const placement::Hardware& hardware);

}  // namespace tandem::train
