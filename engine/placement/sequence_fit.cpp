#include "engine/placement/sequence_fit.h"

#include <algorithm>
#include <cstdio>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/placement/memory_model.h"
#include "engine/placement/placement_evaluator.h"

namespace tandem::placement {

namespace {

// The fullest GPU of `plan` (nullptr without GPUs).
const DevicePlan* fullestGpu(const MemoryPlan& plan) {
  const DevicePlan* out = nullptr;
  for (const DevicePlan& d : plan.devices) {
    if (d.device.isGpu() && (!out || d.total() > out->total())) out = &d;
  }
  return out;
}

// `request` at `cutoff_len`, found by the search (no lengthening advice: that searches again).
SequenceFit search(const PlanRequest& request, const Hardware& hardware, const MemoryPlan& plan) {
  SequenceFit fit;
  fit.cutoff_len = request.cutoff_len;
  if (const DevicePlan* gpu = fullestGpu(plan)) {
    fit.gpu_peak_bytes = gpu->total();
    fit.gpu_peak_device = gpu->device.str();
  }
  fit.host_bytes = plan.hostBytes();
  auto fitsAt = [&](int64_t cutoff_len) {
    return planAtCutoff(request, hardware, plan, cutoff_len).fits;
  };
  if (!fitsAt(kSequenceStep)) return fit;
  // Power-of-two steps up from kSequenceStep, then halving the gap between the last length that
  // fits and the first that does not, on multiples of kSequenceStep.
  int64_t fits = kSequenceStep;
  while (fits < kMaxPlannedCutoff && fitsAt(std::min(2 * fits, kMaxPlannedCutoff)))
    fits = std::min(2 * fits, kMaxPlannedCutoff);
  if (fits == kMaxPlannedCutoff) {
    fit.at_ceiling = true;
  } else {
    int64_t too_long = std::min(2 * fits, kMaxPlannedCutoff);
    while (too_long - fits > kSequenceStep) {
      const int64_t mid = (fits + too_long) / 2 / kSequenceStep * kSequenceStep;
      (fitsAt(mid) ? fits : too_long) = mid;
    }
  }
  fit.longest_cutoff_len = fits;
  const MemoryPlan longest = planAtCutoff(request, hardware, plan, fits);
  if (const DevicePlan* gpu = fullestGpu(longest)) fit.longest_gpu_peak_bytes = gpu->total();
  fit.longest_host_bytes = longest.hostBytes();
  return fit;
}

std::string lengthText(const SequenceFit& fit) {
  if (fit.longest_cutoff_len == 0)
    return "none (not even " + std::to_string(kSequenceStep) + " tokens)";
  return std::to_string(fit.longest_cutoff_len) + (fit.at_ceiling ? "+" : "") + " tokens";
}

}  // namespace

MemoryPlan planAtCutoff(const PlanRequest& request, const Hardware& hardware,
                        const MemoryPlan& plan, int64_t cutoff_len) {
  if (cutoff_len <= 0) throw Error("cutoff_len must be above 0");
  PlanRequest at = effectiveRequest(request);
  at.cutoff_len = cutoff_len;
  Placement placement = plan.placement;
  if (request.gpu_experts == kAutoGpuExperts) {
    // The planner's own resident experts go first as a sequence grows (placeGpuExperts fills
    // what the GPU has left); counts the user fixed stay.
    for (ModulePlacement& m : placement.modules) {
      if (!m.gpu_experts_fixed) m.gpu_experts = 0;
    }
  }
  const bool packs = !plan.transposed_weights.empty();
  const bool pool_first = plan.transposed_weights == "pool";
  const bool may_pool = packs && (pool_first || request.transposed_weights == "auto");
  MemoryPlan last;
  // The plan's own choices first, then the ones that need less host memory.
  for (const bool keep : {plan.keep_expert_forward, false}) {
    for (const bool pool : {pool_first, may_pool}) {
      last = Evaluator(at, hardware, pool, keep).evaluate(placement);
      last.keep_expert_forward = keep;
      last.transposed_weights = packs ? (pool ? "pool" : "persistent") : "";
      if (last.fits) return last;
    }
  }
  return last;
}

SequenceFit longestSequenceThatFits(const PlanRequest& request, const Hardware& hardware,
                                    const MemoryPlan& plan, bool advise) {
  SequenceFit fit = search(request, hardware, plan);
  if (!advise || !request.training) return fit;
  auto tryChange = [&](const std::string& what, const PlanRequest& changed) {
    const SequenceFit alt = search(changed, hardware, plan);
    if (alt.longest_cutoff_len > fit.longest_cutoff_len)
      fit.lengthen.push_back(what + " (" + lengthText(alt) + ")");
  };
  if (!request.gradient_checkpointing && !request.offload_checkpoints) {
    PlanRequest changed = request;
    changed.gradient_checkpointing = true;
    tryChange("gradient_checkpointing: true", changed);
  }
  if (!request.offload_checkpoints) {
    PlanRequest changed = request;
    changed.offload_checkpoints = true;
    tryChange("offload_checkpoints: true", changed);
  }
  // A quarter of the chunk the request's longest sequence runs with, when that is still 512+.
  const int64_t chunk =
      memory::moeChunkTokens(request.batch_size * std::max(fit.longest_cutoff_len, kSequenceStep),
                             request.moe_token_chunk) /
      4 / kSequenceStep * kSequenceStep;
  // The dense MLPs take the same chunk (gpu::GatedMlp::token_chunk): dense models too.
  if (chunk >= 512) {
    PlanRequest changed = request;
    changed.moe_token_chunk = chunk;
    tryChange("moe_token_chunk: " + std::to_string(chunk), changed);
  }
  if (request.batch_size > 1) {
    PlanRequest changed = request;
    changed.batch_size = 1;
    tryChange("per_device_train_batch_size: 1", changed);
  }
  return fit;
}

std::string sequenceFitLine(const SequenceFit& fit) {
  std::string text = "cutoff_len " + std::to_string(fit.cutoff_len) + ": ";
  if (!fit.gpu_peak_device.empty())
    text += "GPU peak " + formatBytes(fit.gpu_peak_bytes) + " on " + fit.gpu_peak_device + ", ";
  text +=
      "host " + formatBytes(fit.host_bytes) + "; longest cutoff_len that fits: " + lengthText(fit);
  return text;
}

std::string outOfMemoryAdvice(const SequenceFit& fit) {
  std::string text =
      "the planner's longest cutoff_len that fits this machine with these settings "
      "is " +
      lengthText(fit) + " (this run: " + std::to_string(fit.cutoff_len) + ")";
  for (size_t i = 0; i < fit.lengthen.size(); ++i)
    text += (i ? ", or " : "; longer with ") + fit.lengthen[i];
  return text;
}

}  // namespace tandem::placement
