#include "engine/placement/step_time_estimate.h"

#include <algorithm>

#include "engine/placement/expert_time_estimate.h"

namespace tandem::placement {

namespace {

// The physical cores that compute on `device` (cpu: all; cpu:numaK: node K's share of them, by
// the nodes' core counts, which the probe gives as logical CPUs and presets as cores).
int coresOf(const Hardware& hw, Device device) {
  if (device.numaNode() < 0) return hw.cpu.physical_cores;
  int all = 0, node = 0;
  for (const NumaNodeSpec& n : hw.numa_nodes) {
    all += n.cores;
    if (n.id == device.numaNode()) node = n.cores;
  }
  if (all <= 0)
    return hw.cpu.physical_cores / std::max<int>(1, static_cast<int>(hw.numa_nodes.size()));
  return std::max(1, hw.cpu.physical_cores * node / all);
}

const GpuSpec* gpuOf(const Hardware& hw, Device device) {
  for (const GpuSpec& g : hw.gpus) {
    if (g.device() == device) return &g;
  }
  return nullptr;
}

}  // namespace

std::optional<StepTimeEstimate> estimateStepTime(const PlanRequest& request,
                                                 const Hardware& hardware, const MemoryPlan& plan) {
  const io::ModelConfig& model = request.model;
  const int64_t tokens = request.batch_size * request.cutoff_len;
  const bool checkpointing = request.training && request.gradient_checkpointing;
  const bool recomputed = checkpointing && !plan.keep_expert_forward;
  // Forward, the backward's two products (dX and dW), and the checkpointed recomputation.
  const double dense_passes = request.training ? (checkpointing ? 4.0 : 3.0) : 1.0;
  const std::vector<Device> layer_device = plan.placement.layerDevices();
  StepTimeEstimate e;
  for (const ModulePlacement& m : plan.placement.modules) {
    if (m.kind == ModuleKind::RoutedExperts) {
      const int64_t E = std::max<int64_t>(model.num_experts, 1);
      const int64_t rest = E - std::clamp<int64_t>(m.gpu_experts, 0, E);
      if (rest == 0) continue;
      if (m.backend == "gpu-offload") {
        const GpuSpec* gpu = m.compute_device ? gpuOf(hardware, *m.compute_device) : nullptr;
        if (!gpu) return std::nullopt;
        const std::optional<double> ms =
            streamedExpertsMs(model, rest, m.weight_format, request.bf16, *gpu);
        if (!ms) return std::nullopt;
        e.streamed_ms += *ms;
        continue;
      }
      CpuSpec cores = hardware.cpu;
      cores.physical_cores = coresOf(hardware, m.device);
      const std::optional<double> ms = cpuExpertsMs(
          model, tokens, static_cast<double>(rest) / static_cast<double>(E), cores, recomputed);
      if (!ms) return std::nullopt;
      e.expert_engine_ms += *ms;
      continue;
    }
    // The embedding is a lookup and the final norm no product: neither is a matmul's work.
    if (!m.device.isCpu() || m.kind == ModuleKind::Embedding || m.kind == ModuleKind::FinalNorm)
      continue;
    const double flops = 2.0 * dense_passes * static_cast<double>(moduleParameters(model, m)) *
                         static_cast<double>(tokens);
    const std::optional<double> ms = cpuMatmulMs(flops, coresOf(hardware, m.device), hardware.cpu);
    if (!ms) return std::nullopt;
    e.cpu_dense_ms += *ms;
  }
  e.step_ms = e.expert_engine_ms + e.cpu_dense_ms + e.streamed_ms;
  e.tokens_per_s = e.step_ms > 0 ? static_cast<double>(tokens) * 1e3 / e.step_ms : 0;
  if (e.step_ms <= 0) return std::nullopt;  // nothing on the CPU: no measured rate applies
  return e;
}

}  // namespace tandem::placement
