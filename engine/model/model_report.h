#pragma once
// What a training run tells the user about the model as loaded and as it runs: which expert
// engine computes the routed experts, and how much of the routed work the resident experts took.

#include <string>

namespace tandem::model {

class Model;
struct AppliedPlacement;

// "placement: layers cuda:0:0-23,cuda:1:24-47, lm_head on cuda:1, 190 routed experts resident
// over 48 layers": where a loaded model runs (Model::placement()), the planner's placement unless
// the user overrode it.
std::string placementSummary(const AppliedPlacement& placement);

// "routed experts: amx_int8, int8 packs, W^T on_demand, 8 per layer resident on the GPU (fp8
// checkpoint)": what the planner and the expert engine chose.
std::string expertsSummary(const Model& model);

// "resident experts took 94.6 % of the routed pairs so far; the CPU engine computed 5.4 %":
// said after the first step, since the CPU's share is what sets the pace (more gpu_experts, or
// fewer tokens per step, when it is large). Empty without resident experts or before any call.
std::string residentExpertsShare(const Model& model);

}  // namespace tandem::model
