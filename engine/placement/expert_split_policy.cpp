#include "engine/placement/expert_split_policy.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "engine/core/error.h"

namespace tandem::placement {

namespace {

// 6·H·I FLOP per token: gate and up [H → I], down [I → H], 2 FLOP per multiply-add.
double expertFlops(const LayerCosts& c, int64_t tokens) {
  return 6.0 * static_cast<double>(c.hidden) * static_cast<double>(c.intermediate) *
         static_cast<double>(tokens);
}

double curveMs(const RateCurve& curve, LayerPass pass, double flops, int64_t tokens) {
  if (tokens <= 0) return 0;
  const auto t = static_cast<double>(tokens);
  auto at = [&](double rate) { return rate > 0 ? 1e3 * flops / rate : 0.0; };
  switch (pass) {
    case LayerPass::Forward: return at(curve.forwardRate(t));
    case LayerPass::Backward: return at(curve.backwardRate(t));
    case LayerPass::ForwardAndBackward: return at(curve.forwardRate(t)) + at(curve.backwardRate(t));
  }
  return 0;
}

double passCount(LayerPass pass) { return pass == LayerPass::ForwardAndBackward ? 2.0 : 1.0; }

}  // namespace

double LayerCosts::cpuMs(int64_t tokens) const {
  return curveMs(cpu, pass, expertFlops(*this, tokens), tokens);
}

double LayerCosts::gpuMs(int64_t tokens) const {
  if (!has_gpu || tokens <= 0) return 0;
  return curveMs(gpu_gemm, pass, expertFlops(*this, tokens), tokens) +
         passCount(pass) * gpu_expert_overhead_ms;
}

double LayerCosts::streamedGpuMs() const {
  return has_gpu ? passCount(pass) * streamed_expert_ms : 0;
}

double LayerCosts::copyMs() const {
  return has_gpu && host_to_device_bytes_per_s > 0
             ? passCount(pass) * 1e3 * expert_bytes / host_to_device_bytes_per_s
             : 0;
}

LayerCosts expertLayerCosts(const MachineRates& rates, const ExpertCostShape& shape,
                            LayerPass pass) {
  LayerCosts costs;
  costs.hidden = shape.hidden;
  costs.intermediate = shape.intermediate;
  costs.pass = pass;
  if (const ExpertEngineRates* cpu = rates.cpuFor(shape.format)) {
    costs.cpu = cpu->curve;
    costs.cpu_call_ms = (pass != LayerPass::Backward ? cpu->forward_call_ms : 0.0) +
                        (pass != LayerPass::Forward ? cpu->backward_call_ms : 0.0);
  }
  if (const GpuRates* gpu = shape.gpu >= 0 ? rates.gpu(shape.gpu) : nullptr) {
    costs.has_gpu = true;
    costs.gpu_gemm = gpu->expert_gemm;
    costs.host_to_device_bytes_per_s = gpu->host_to_device_bytes_per_s;
    costs.expert_bytes = shape.expert_bytes;
    // bf16 experts are computed as held; int8 / int4 ones are cast to bf16 (2 bytes a weight)
    // for each pass.
    const double cast_ms = shape.format != "bf16" && gpu->weight_cast_bytes_per_s > 0
                               ? 1e3 * 6.0 *
                                     static_cast<double>(shape.hidden * shape.intermediate) /
                                     gpu->weight_cast_bytes_per_s
                               : 0.0;
    costs.gpu_expert_overhead_ms = gpu->expert_overhead_ms + cast_ms;
    costs.streamed_expert_ms = gpu->split_streamed_expert_ms;
    costs.split_cpu_call_ms = gpu->split_cpu_call_ms;
  }
  return costs;
}

double ExpertSplit::finishMs() const { return std::max({cpu_ms, gpu_ms, copy_ms}); }

ExpertSplit splitLayer(const LayerCosts& costs, std::span<const int64_t> tokens_per_expert,
                       std::span<const int64_t> resident) {
  const auto E = static_cast<int64_t>(tokens_per_expert.size());
  if (!costs.has_gpu && !resident.empty())
    throw Error("the expert split was given resident experts on a machine without a GPU",
                "pass no resident experts when the cost model has no GPU");
  std::vector<char> is_resident(static_cast<size_t>(E), 0);
  for (const int64_t id : resident) {
    if (id < 0 || id >= E)
      throw Error("resident expert " + std::to_string(id) + " is out of range for a layer of " +
                      std::to_string(E) + " experts",
                  "name resident experts by their id in [0, " + std::to_string(E) + ")");
    is_resident[static_cast<size_t>(id)] = 1;
  }
  for (int64_t e = 0; e < E; ++e) {
    if (tokens_per_expert[static_cast<size_t>(e)] < 0)
      throw Error("expert " + std::to_string(e) + " has a negative token count",
                  "pass the number of (token, expert) pairs routed to each expert");
  }
  ExpertSplit split;
  split.cpu_ms = costs.cpu_base_ms;
  split.gpu_ms = costs.gpu_base_ms;
  std::vector<int64_t> others;  // not resident, by tokens descending (ties: lower id first)
  for (int64_t e = 0; e < E; ++e) {
    const int64_t tokens = tokens_per_expert[static_cast<size_t>(e)];
    if (is_resident[static_cast<size_t>(e)]) {
      split.resident.push_back(e);
      split.gpu_ms += costs.gpuMs(tokens);
    } else {
      others.push_back(e);
      split.cpu_ms += costs.cpuMs(tokens);
    }
  }
  std::stable_sort(others.begin(), others.end(), [&](int64_t a, int64_t b) {
    return tokens_per_expert[static_cast<size_t>(a)] > tokens_per_expert[static_cast<size_t>(b)];
  });
  double copied_ms = 0;  // the copy engine's total for this pass, before the head start
  size_t moved = 0;
  if (costs.has_gpu) {
    for (; moved < others.size(); ++moved) {
      const int64_t tokens = tokens_per_expert[static_cast<size_t>(others[moved])];
      if (tokens == 0) break;  // the rest cost nothing anywhere
      ExpertSplit next = split;
      // The host issues a streamed expert's device work before it calls the CPU engine: its
      // staging delays the CPU side as much as it occupies the GPU.
      next.cpu_ms += costs.streamedGpuMs() - costs.cpuMs(tokens);
      next.gpu_ms += costs.gpuMs(tokens) + costs.streamedGpuMs();
      next.copy_ms = std::max(0.0, copied_ms + costs.copyMs() - costs.copy_head_start_ms);
      if (next.finishMs() >= split.finishMs()) break;
      copied_ms += costs.copyMs();
      split.cpu_ms = next.cpu_ms;
      split.gpu_ms = next.gpu_ms;
      split.copy_ms = next.copy_ms;
    }
  }
  // The engine's call costs its fixed part when any of its experts has tokens (the greedy above
  // leaves it out: one call either way until the last expert leaves), and more beside a GPU
  // that computes experts too (split_cpu_call_ms).
  size_t routed = others.size();  // others[routed..]: no tokens
  while (routed > 0 && tokens_per_expert[static_cast<size_t>(others[routed - 1])] == 0) --routed;
  const bool gpu_computes = !split.resident.empty() || moved > 0;
  if (moved < routed)
    split.cpu_ms +=
        costs.cpu_call_ms + (gpu_computes ? passCount(costs.pass) : 0.0) * costs.split_cpu_call_ms;
  // The greedy stops at the first move that does not pay, before the call's fixed cost leaves
  // with the last CPU expert: streaming every routed one may finish sooner.
  if (costs.has_gpu && moved < routed) {
    ExpertSplit all = split;
    all.cpu_ms = costs.cpu_base_ms;
    all.gpu_ms = costs.gpu_base_ms;
    for (const int64_t e : split.resident)
      all.gpu_ms += costs.gpuMs(tokens_per_expert[static_cast<size_t>(e)]);
    for (size_t i = 0; i < routed; ++i) {
      all.gpu_ms +=
          costs.gpuMs(tokens_per_expert[static_cast<size_t>(others[i])]) + costs.streamedGpuMs();
      all.cpu_ms += costs.streamedGpuMs();
    }
    all.copy_ms =
        std::max(0.0, static_cast<double>(routed) * costs.copyMs() - costs.copy_head_start_ms);
    if (all.finishMs() < split.finishMs()) {
      split.cpu_ms = all.cpu_ms;
      split.gpu_ms = all.gpu_ms;
      split.copy_ms = all.copy_ms;
      moved = routed;
    }
  }
  split.streamed.assign(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(moved));
  split.cpu.assign(others.begin() + static_cast<std::ptrdiff_t>(moved), others.end());
  std::sort(split.cpu.begin(), split.cpu.end());
  split.cpu_ms = std::max(split.cpu_ms, costs.cpu_base_ms);  // no negative drift from rounding
  return split;
}

}  // namespace tandem::placement
