#include "engine/placement/plan_step_cost.h"

#include <algorithm>

#include "engine/io/lora_target.h"
#include "engine/placement/memory_model.h"

namespace tandem::placement {

namespace {

int64_t expertLoraParameters(const PlanRequest& request) {
  std::string joined;
  for (const std::string& t : request.lora_target) joined += (joined.empty() ? "" : ",") + t;
  const io::LoraTarget target = io::LoraTarget::parse(joined);
  int64_t n = 0;
  for (int l = 0; l < request.model.num_hidden_layers; ++l) {
    if (request.model.isMoeLayer(l))
      n += memory::loraParameters(request.model, ModuleKind::RoutedExperts, l, target,
                                  request.lora_rank);
  }
  return n;
}

}  // namespace

StepCostRequest stepCostRequestFor(const PlanRequest& request, const MemoryPlan& plan) {
  StepCostRequest r;
  r.model = request.model;
  r.tokens = request.batch_size * request.cutoff_len;
  r.training = request.training;
  r.gradient_checkpointing = request.gradient_checkpointing;
  r.keep_expert_forward = plan.keep_expert_forward;
  r.bf16 = request.bf16;
  r.expert_lora_parameters = request.training ? expertLoraParameters(request) : 0;
  for (const ModulePlacement& m : plan.placement.modules) {
    if (m.kind != ModuleKind::RoutedExperts) continue;
    r.weight_format = m.weight_format;  // rates of another format stand in for one not measured
    r.resident_experts = std::max(r.resident_experts, m.gpu_experts);
    const std::optional<Device> gpu = m.compute_device ? m.compute_device : std::optional<Device>();
    if (gpu && gpu->isGpu()) r.gpu = gpu->gpuIndex();
  }
  return r;
}

std::string placementMode(const MemoryPlan& plan) {
  bool offload = false, resident = false;
  for (const ModulePlacement& m : plan.placement.modules) {
    if (m.kind != ModuleKind::RoutedExperts) continue;
    offload = offload || m.backend == "gpu-offload";
    resident = resident || m.gpu_experts > 0;
  }
  if (offload) return resident ? "offload-resident" : "offload";
  return resident ? "resident" : "co";
}

std::string plannedMode(const PlanRequest& request, const MemoryPlan& plan,
                        const MachineRates& rates) {
  if (request.split_experts && request.training &&
      rates.gpu(stepCostRequestFor(request, plan).gpu) != nullptr)
    return "split";
  return placementMode(plan);
}

}  // namespace tandem::placement
