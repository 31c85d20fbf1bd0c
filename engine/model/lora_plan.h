#pragma once
// Which modules of a model get a LoRA adapter when it is built, and with what settings. No
// libtorch: training and generation make the plan; the model builder follows it.

#include <cstdint>
#include <functional>
#include <string>

#include "engine/gpu/lora_settings.h"
#include "engine/io/lora_target.h"

namespace tandem::model {

// Module names are full HF names ("model.layers.0.self_attn.q_proj"); routed experts are asked
// per projection with the name "model.layers.N.mlp.experts.gate_proj" (one adapter per expert,
// all experts alike).
struct LoraPlan {
  gpu::LoraSettings settings;
  int expert_rank = 0;  // routed experts' rank when it differs (general fused PEFT adapters)
  uint64_t seed = 0;    // fresh adapters' init: the same seed gives the same A matrices
  // LoRA experts (lora_experts.h): paths per MoE layer (0: none) and their intermediate size.
  int64_t lora_experts = 0;
  int64_t le_dim = 0;
  std::function<bool(const std::string& module_name)> targets;
};

// The plan for fresh adapters from LLaMA-Factory's lora_target.
LoraPlan loraPlanFromTarget(const io::LoraTarget& target, const gpu::LoraSettings& settings);

}  // namespace tandem::model
