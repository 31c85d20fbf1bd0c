#include "engine/train/training_plan.h"

#include "engine/core/error.h"
#include "engine/placement/kt_rules.h"
#include "engine/placement/placement.h"

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
  r.experts_backend = config.experts_backend;
  // The runtime's choices (training_run.cpp): the experts' format as the planner spells it
  // ("" = its default for the backend and checkpoint), and on_demand Wᵀ is the planner's pool.
  if (config.experts_format == "fp8" && !(model.quantization && model.quantization->quant_method == "fp8")) {
    throw Error("experts_format: fp8 keeps the checkpoint's fp8 experts, but " + config.model_name_or_path +
                    " is not an fp8 checkpoint (its config.json has no fp8 quantization_config)",
                "use experts_format: auto, bf16 or int8 (int8 quantises the experts at load)");
  }
  if (config.experts_format != "auto") r.expert_weight_format = config.experts_format;
  if (config.experts_mode == "gpu-offload") {
    // Offload mode streams (and keeps resident) the experts in the format the CPU backend would
    // pack them in; the planner then charges the pinned host copy, the offload buffers and the
    // resident cache instead of packs.
    if (r.expert_weight_format.empty() && placement::defaultWeightFormat(r.experts_backend, model) == "int8") {
      r.expert_weight_format = "int8";
    }
    r.experts_backend = "gpu-offload";
  }
  r.gpu_experts = config.gpu_experts == "auto" ? placement::kAutoGpuExperts : std::stoll(config.gpu_experts);
  if (config.experts_wt_policy != "auto") {  // on_demand and background: the same pool of two layers
    r.transposed_weights = config.experts_wt_policy == "persistent" ? "persistent" : "pool";
  }
  return r;
}

placement::MemoryPlan planTraining(const TrainConfig& config, const io::ModelConfig& model,
                                   const placement::Hardware& hardware) {
  const placement::PlanRequest request = planRequestFor(config, model);
  if (config.placement_rule.empty()) return placement::planMemory(request, hardware);
  return placement::evaluatePlacement(request, hardware, placement::loadPlacementFile(config.placement_rule, model));
}

}  // namespace tandem::train
