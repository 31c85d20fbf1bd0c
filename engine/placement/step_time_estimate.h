#pragma once
// What a plan's training step costs the CPU, and so how many tokens a second it allows at most:
// the pace-setter the planner's notes name (docs/benchmarks.md: the CPU's share of the routed
// pairs sets the step time). Built from the rates expert_time_estimate.h measured on the team's
// H200 machine, nothing else:
//   - the CPU expert engine computing each MoE layer's non-resident share of the routed pairs
//     (forward, backward, and the recomputation when the expert forward is not kept), on the cores
//     of the node(s) that hold the layer's experts;
//   - dense modules placed on the CPU (attention, router, shared experts, dense MLP, lm_head) at
//     the same per-core rate, 2 FLOP per parameter and token per pass: forward, the backward's dX
//     and dW, and the checkpointed recomputation (attention's score matrix and the embedding
//     lookup are left out);
//   - offloaded experts streamed over the GPU's PCIe link.
// The GPUs' own compute is not counted (no per-card rate is measured): the figure is a ceiling on
// tokens/s, which dragging work onto or off the CPU moves. nullopt where a rate is missing (a CPU
// without AMX, an unknown PCIe link).

#include <optional>

#include "engine/placement/hardware.h"
#include "engine/placement/memory_planner.h"

namespace tandem::placement {

struct StepTimeEstimate {
  double expert_engine_ms = 0;  // the CPU expert engine, all MoE layers
  double cpu_dense_ms = 0;      // dense modules on the CPU
  double streamed_ms = 0;       // gpu-offload: experts over PCIe
  double step_ms = 0;           // their sum: the CPU side's time per step
  double tokens_per_s = 0;      // batch_size · cutoff_len tokens per step / step_ms
};

std::optional<StepTimeEstimate> estimateStepTime(const PlanRequest& request,
                                                 const Hardware& hardware, const MemoryPlan& plan);

}  // namespace tandem::placement
