#include "engine/train/training_plan.h"

#include "engine/placement/kt_rules.h"

namespace tandem::train {

placement::PlanRequest planRequestFor(const TrainConfig& config, const io::ModelConfig& model) {
  placement::PlanRequest r;
  r.model = model;
  r.lora_rank = static_cast<int>(config.lora_rank);
  r.lora_target = config.lora_target;
  r.cutoff_len = config.cutoff_len;
  r.batch_size = config.per_device_train_batch_size;
  r.gradient_checkpointing = config.gradient_checkpointing;
  r.bf16 = config.bf16;
  r.loss_chunk_tokens = config.loss_chunk_tokens;
  // TrainConfig spells the AVX-512 BF16 kernels "avx512" too (training_run maps it the same way).
  r.experts_backend = config.experts_backend == "avx512" ? "avx512_bf16" : config.experts_backend;
  return r;
}

placement::MemoryPlan planTraining(const TrainConfig& config, const io::ModelConfig& model,
                                   const placement::Hardware& hardware) {
  const placement::PlanRequest request = planRequestFor(config, model);
  if (config.placement_rule.empty()) return placement::planMemory(request, hardware);
  return placement::evaluatePlacement(request, hardware, placement::loadPlacementFile(config.placement_rule, model));
}

}  // namespace tandem::train
