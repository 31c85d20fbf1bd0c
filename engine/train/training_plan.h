#pragma once
// The memory plan of a training config, before anything is loaded: the model part of the config
// planned as every product plans it (engine/model/model_resolver.h), plus the LoRA and batch
// settings (lora_rank, lora_target, cutoff_len, per_device_train_batch_size). `tandem plan`
// prints it; runTraining refuses early when it does not fit and then runs exactly its placement.

#include <string>

#include "engine/io/model_config.h"
#include "engine/placement/hardware.h"
#include "engine/placement/lora_experts_budget.h"
#include "engine/placement/memory_planner.h"
#include "engine/placement/sequence_fit.h"
#include "engine/train/train_config.h"

namespace tandem::train {

placement::PlanRequest planRequestFor(const TrainConfig& config, const io::ModelConfig& model);

// The planner's placement on the part of `hardware` the config lets the run use (device: cpu
// hides the GPUs), or kt_optimize_rule's placement (a KT rule file or a presets/placement file,
// relative to the working directory as LLaMA-Factory resolves it) evaluated.
// The config's lora_experts (and le_dim) for `plan`: N as given, auto as the planner sizes it
// (placement/lora_experts_budget.h). With lora_experts: auto, gpu_experts: auto plans no resident
// experts (planRequestFor), so the GPU memory left over goes to LE.
placement::LoraExpertsChoice loraExpertsFor(const TrainConfig& config, const io::ModelConfig& model,
                                            const placement::MemoryPlan& plan);

placement::MemoryPlan planTraining(const TrainConfig& config, const io::ModelConfig& model,
                                   const placement::Hardware& hardware);

// The longest cutoff_len that fits `plan`'s placement on `hardware` (as probed for the plan)
// with this config's settings, and what lengthens it (placement/sequence_fit.h): the studio's
// training page line.
placement::SequenceFit sequenceFitFor(const TrainConfig& config, const io::ModelConfig& model,
                                      const placement::MemoryPlan& plan,
                                      const placement::Hardware& hardware);

// The same for the trainer's out-of-memory error, as a sentence.
std::string longestSequenceAdvice(const TrainConfig& config, const io::ModelConfig& model,
                                  const placement::MemoryPlan& plan,
                                  const placement::Hardware& hardware);

}  // namespace tandem::train
