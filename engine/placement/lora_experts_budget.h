#pragma once
// How many LoRA-expert paths (engine/model/lora_experts.h, issue 32) a training run gets with
// `lora_experts: auto`: the GPU memory the memory plan leaves free after the working set, shared
// by the MoE layers of each GPU, each path costing its weights, gradients, AdamW moments and the
// activations autograd keeps (docs/training_config.md, docs/placement.md). Without a GPU, auto
// is a fixed small LE (kLoraExpertsCpuDefault paths): the host has no "left over" memory in the
// same sense, and every LE FLOP is then a CPU FLOP the experts do not get.

#include <cstdint>
#include <string>

#include "engine/placement/memory_planner.h"

namespace tandem::placement {

inline constexpr int64_t kLoraExpertsCpuDefault = 1;  // auto without a GPU
// auto never goes past this many paths per layer: past it LE is a dense MLP, not an adapter (a
// spare 60 GB would otherwise become a 2-billion-parameter "adapter").
inline constexpr int64_t kLoraExpertsAutoMax = 8;

struct LoraExpertsChoice {
  int64_t paths = 0;  // per MoE layer
  int64_t le_dim = 0;
  uint64_t bytes_per_layer = 0;  // on its device, training
  std::string reason;            // one line for `tandem plan`
};

// Bytes of one path of le_dim for a block of width `hidden` while training on `tokens` tokens a
// micro-batch: 16 B a parameter (fp32 weight, grad, exp_avg, exp_avg_sq) plus the fp32 input and
// the four [tokens, le_dim] fp32 intermediates (gate, up, silu(gate), product) kept for backward.
uint64_t loraExpertPathBytes(int64_t hidden, int64_t le_dim, int64_t tokens);

// `requested` paths (>= 0) or, kAutoLoraExperts, the planner's choice for `plan`.
inline constexpr int64_t kAutoLoraExperts = -1;
LoraExpertsChoice chooseLoraExperts(const MemoryPlan& plan, const PlanRequest& request,
                                    int64_t requested, int64_t le_dim);

// Charges the chosen LE to the plan: an item "LoRA experts" (category lora_optimizer) on the device
// of each MoE layer (its GPU, else the first host node), and `fits`/`problems` updated when that
// overflows.
void addLoraExpertsToPlan(MemoryPlan& plan, const PlanRequest& request,
                          const LoraExpertsChoice& choice);

}  // namespace tandem::placement
