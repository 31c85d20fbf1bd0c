#pragma once
// The cost model (step_cost.h) for a memory plan: the StepCostRequest a plan implies (tokens per
// step, checkpointing, the experts' format, the resident experts the GPU holds, the expert LoRA
// the CPU AdamW steps) and which experts mode the plan's placement runs. What `tandem plan` and
// the studio's placement board predict tokens/s from.

#include <string>

#include "engine/placement/memory_planner.h"
#include "engine/placement/step_cost.h"

namespace tandem::placement {

// Resident experts: the most any MoE layer of the plan holds on its GPU (per-layer counts that
// differ are predicted at the largest).
StepCostRequest stepCostRequestFor(const PlanRequest& request, const MemoryPlan& plan);

// "co", "resident", "offload" or "offload-resident": the mode of the plan's routed experts (their
// backend, and whether any layer keeps experts on its GPU).
std::string placementMode(const MemoryPlan& plan);

// The cost model's mode a run of this plan gets: "split" for experts_mode auto
// (request.split_experts) on a GPU `rates` has terms for, else placementMode(plan) (auto without
// a GPU runs as cpu mode: "co", or "resident" with a count of resident experts).
std::string plannedMode(const PlanRequest& request, const MemoryPlan& plan,
                        const MachineRates& rates);

}  // namespace tandem::placement
