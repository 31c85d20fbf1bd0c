#pragma once
// What a training run tells the user about the model as loaded and as it runs: which expert
// engine computes the routed experts, and how much of the routed work the resident experts took.

#include <string>

namespace tandem::model {
class CausalLm;
}

namespace tandem::train {

// "routed experts: amx_int8, int8 packs, W^T on_demand, 8 per layer resident on the GPU (fp8
// checkpoint)": what the planner and the expert engine chose.
std::string expertsSummary(model::CausalLm& model);

// "resident experts took 94.6 % of the routed pairs so far; the CPU engine computed 5.4 %":
// said after the first step, since the CPU's share is what sets the pace (more gpu_experts, or
// fewer tokens per step, when it is large). Empty without resident experts or before any call.
std::string residentExpertsShare(model::CausalLm& model);

}  // namespace tandem::train
