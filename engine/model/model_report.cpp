#include "engine/train/model_report.h"

#include <cstdio>

#include "engine/experts/expert_layer.h"
#include "engine/model/causal_lm.h"

namespace tandem::train {

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

std::string expertsSummary(model::CausalLm& model) {
  std::string summary;
  model.visitMoeBlocks([&](const std::string&, model::MoeBlock& block) {
    if (!summary.empty() || !block.experts) return;
    const experts::ExpertLayer& e = *block.experts;
    const bool fp8 = model.config().quantization && model.config().quantization->quant_method == "fp8";
    const std::string held =
        block.offload ? std::string(experts::weightFormatName(e.weightFormat())) + " packs" : heldAs(e, fp8);
    summary = "routed experts: " + (block.offload ? std::string("gpu-offload") : e.backendName()) + ", " + held +
              ", W^T " + std::string(experts::wtPolicyName(e.wtPolicy()));
    if (block.resident_count > 0) {
      summary += ", " + std::to_string(block.resident_count) + " per layer resident on the GPU";
    }
    if (model.config().quantization) summary += " (" + model.config().quantization->quant_method + " checkpoint)";
  });
  return summary.empty() ? "no routed experts (dense model)" : summary;
}

std::string residentExpertsShare(model::CausalLm& model) {
  bool resident = false, streamed = false;
  int64_t routed_pairs = 0, resident_pairs = 0;
  model.visitMoeBlocks([&](const std::string&, model::MoeBlock& block) {
    resident = resident || block.resident_count > 0;
    streamed = streamed || block.offload;
    routed_pairs += block.pairs.routed;
    resident_pairs += block.pairs.resident;
  });
  if (!resident || routed_pairs == 0) return {};
  const double share = 100.0 * static_cast<double>(resident_pairs) / static_cast<double>(routed_pairs);
  char text[128];
  std::snprintf(text, sizeof text, "resident experts took %.1f %% of the routed pairs so far; %s %.1f %%", share,
                streamed ? "the streamed experts computed" : "the CPU engine computed", 100.0 - share);
  return text;
}

}  // namespace tandem::train
