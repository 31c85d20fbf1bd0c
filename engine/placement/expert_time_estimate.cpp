#include "engine/placement/expert_time_estimate.h"

#include "engine/placement/memory_model.h"

namespace tandem::placement {

namespace {

// The measured forward: 2 · 3 · H · I FLOP per pair, 2048 · 8 pairs of Qwen3-30B-A3B's
// H = 2048, I = 768 in 39 ms on 16 cores: ~0.25 TFLOP/s a core. The backward took 1.2 times it.
constexpr double kAmxFlopsPerCore = 0.25e12;
constexpr double kBackwardOverForward = 1.2;
// Pinned host → device, per PCIe lane and generation (x16 Gen 5 measured ~55 GB/s).
constexpr double kLaneBytesPerS[] = {0, 0.25e9, 0.5e9, 0.85e9, 1.6e9, 3.4e9, 6.8e9};

}  // namespace

std::optional<double> cpuExpertsMs(const io::ModelConfig& model, int64_t tokens, double cpu_share,
                                   const CpuSpec& cpu, bool recomputed) {
  if (!cpu.amx_bf16 || cpu.physical_cores <= 0) return std::nullopt;
  const double forward_flops = 2.0 * 3.0 * static_cast<double>(model.hidden_size) *
                               static_cast<double>(model.moe_intermediate_size) *
                               static_cast<double>(tokens * model.num_experts_per_tok) * cpu_share;
  const double passes = 1.0 + kBackwardOverForward + (recomputed ? 1.0 : 0.0);
  return 1e3 * passes * forward_flops / (kAmxFlopsPerCore * cpu.physical_cores);
}

std::optional<double> cpuMatmulMs(double flops, int cores, const CpuSpec& cpu) {
  if (!cpu.amx_bf16 || cores <= 0) return std::nullopt;
  return 1e3 * flops / (kAmxFlopsPerCore * cores);
}

std::optional<double> streamedExpertsMs(const io::ModelConfig& model, int64_t experts,
                                        const std::string& weight_format, bool bf16,
                                        const GpuSpec& gpu) {
  const int generations = static_cast<int>(sizeof kLaneBytesPerS / sizeof kLaneBytesPerS[0]);
  if (gpu.pcie_gen <= 0 || gpu.pcie_gen >= generations || gpu.pcie_lanes <= 0) return std::nullopt;
  const double bytes = 2.0 * static_cast<double>(experts) *
                       static_cast<double>(memory::residentExpertBytes(model, weight_format, bf16));
  return 1e3 * bytes / (kLaneBytesPerS[gpu.pcie_gen] * gpu.pcie_lanes);
}

}  // namespace tandem::placement
