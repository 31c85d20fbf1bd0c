#include "engine/model/model_report.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "engine/experts/expert_layer.h"
#include "engine/model/causal_lm.h"
#include "engine/model/device_map.h"
#include "engine/model/model.h"

namespace tandem::model {

namespace {
// How the frozen experts are held: the fp32 backends read bf16 / f16 / f32 experts where they lie
// (engine/experts/kernels/plain_gemm.cpp); every other backend, and int8 or an fp8 checkpoint on
// those, holds packs.
std::string heldAs(const experts::ExpertLayer& e, bool fp8_checkpoint) {
  const std::string format(experts::weightFormatName(e.weightFormat()));
  const std::string& backend = e.backendName();
  const bool fp32_backend = backend == "generic" || backend == "avx2" || backend == "avx512";
  if (fp32_backend && e.weightFormat() == experts::WeightFormat::Bf16 && !fp8_checkpoint) {
    return "read in place";
  }
  return format + " packs";
}
}  // namespace

std::string placementSummary(const AppliedPlacement& placement) {
  std::string text = "placement: layers " + formatLayerDevices(placement.layers) + ", lm_head on " +
                     placement.head.str();
  const int64_t resident = std::accumulate(placement.resident_experts.begin(),
                                           placement.resident_experts.end(), int64_t{0});
  const auto layers =
      std::count_if(placement.resident_experts.begin(), placement.resident_experts.end(),
                    [](int64_t n) { return n > 0; });
  if (resident > 0) {
    text += ", " + std::to_string(resident) + " routed experts resident over " +
            std::to_string(layers) + " layers";
  }
  return text;
}

std::string expertsSummary(const Model& model) {
  std::string summary;
  model.lm().visitMoeBlocks([&](size_t, const MoeBlock& block) {
    if (!summary.empty() || !block.experts) return;
    const experts::ExpertLayer& e = *block.experts;
    const bool fp8 =
        model.config().quantization && model.config().quantization->quant_method == "fp8";
    const std::string held =
        block.offload ? std::string(experts::weightFormatName(e.weightFormat())) + " packs"
                      : heldAs(e, fp8);
    summary = "routed experts: " + (block.offload ? std::string("gpu-offload") : e.backendName()) +
              ", " + held + ", W^T " + std::string(experts::wtPolicyName(e.wtPolicy()));
    if (block.resident_count > 0) {
      summary += ", " + std::to_string(block.resident_count) + " per layer resident on the GPU";
    }
    if (model.config().quantization)
      summary += " (" + model.config().quantization->quant_method + " checkpoint)";
  });
  return summary.empty() ? "no routed experts (dense model)" : summary;
}

std::string residentExpertsShare(const Model& model) {
  bool resident = false, streamed = false;
  int64_t routed_pairs = 0, resident_pairs = 0;
  model.lm().visitMoeBlocks([&](size_t, const MoeBlock& block) {
    resident = resident || block.resident_count > 0;
    streamed = streamed || block.offload;
    routed_pairs += block.pairs.routed;
    resident_pairs += block.pairs.resident;
  });
  if (!resident || routed_pairs == 0) return {};
  const double share =
      100.0 * static_cast<double>(resident_pairs) / static_cast<double>(routed_pairs);
  char text[128];
  std::snprintf(
      text, sizeof text, "resident experts took %.1f %% of the routed pairs so far; %s %.1f %%",
      share, streamed ? "the streamed experts computed" : "the CPU engine computed", 100.0 - share);
  return text;
}

}  // namespace tandem::model
