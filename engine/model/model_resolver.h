#pragma once
// From what the user asked for to a placed model, in one place:
//
//   ModelRequest (YAML keys, CLI options, studio fields)
//     -> planRequestFor + usableHardware + planModel   the memory plan: placement and verdict
//     -> resolveModelOptions                            typed ModelOptions for Model::load
//
// Training (train/training_plan.h) adds its LoRA and batch settings to the plan request,
// generation (infer/generator.h) its KV cache; both then run exactly the placement the planner
// judged: layers split over every GPU by default, a rule file's placement when one is given,
// with --device / layer_devices / a gpu_experts count as explicit overrides. No libtorch.

#include <string_view>

#include "engine/io/model_config.h"
#include "engine/model/model_options.h"
#include "engine/model/model_request.h"
#include "engine/placement/hardware.h"
#include "engine/placement/memory_planner.h"

namespace tandem::model {

// The planner's request for the model part of `request`: dtype, checkpointing, the loss chunk,
// the experts' mode, backend and format, resident experts, the Wᵀ form and whether a backward
// runs. Errors on what the model cannot take (experts_format: fp8 on a checkpoint that is not).
placement::PlanRequest planRequestFor(const ModelRequest& request, const io::ModelConfig& config);

// The machine as `request` lets the model use it: device cpu hides every GPU, cuda:N all but
// that one (an Error naming the GPUs there are when the machine has no cuda:N).
placement::Hardware usableHardware(const ModelRequest& request, placement::Hardware hardware);

// The memory plan on `hardware`: the planner's own placement, or, with a placement_rule, that
// file's placement (KTransformers rule or preset) evaluated.
placement::MemoryPlan planModel(const placement::PlanRequest& plan_request,
                                const ModelRequest& request, const placement::Hardware& hardware);

// An Error with the planner's problems and advice when `plan` does not fit; `what` names the
// job ("this run", "this model").
void requireFits(const placement::MemoryPlan& plan, std::string_view what);

// The one constructor of ModelOptions: the plan's placement (each layer's device, resident
// experts per layer, a rule file's experts backend, format and NUMA nodes), then the request's
// explicit overrides (device, layer_devices, head_device, a gpu_experts count), then its other
// settings (dtype, experts mode / backend / format / Wᵀ / task split, checkpointing, ...).
ModelOptions resolveModelOptions(const ModelRequest& request, const io::ModelConfig& config,
                                 const placement::MemoryPlan& plan);

}  // namespace tandem::model
