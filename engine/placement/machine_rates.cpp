#include "engine/placement/machine_rates.h"

#include <algorithm>
#include <cmath>
#include <string_view>

namespace tandem::placement {

namespace {

double interpolate(const std::vector<RatePoint>& points, double tokens_per_expert,
                   double RatePoint::*rate) {
  if (points.empty() || tokens_per_expert <= 0) return 0;
  if (tokens_per_expert <= points.front().tokens_per_expert) return points.front().*rate;
  if (tokens_per_expert >= points.back().tokens_per_expert) return points.back().*rate;
  for (size_t i = 1; i < points.size(); ++i) {
    const RatePoint& a = points[i - 1];
    const RatePoint& b = points[i];
    if (tokens_per_expert > b.tokens_per_expert) continue;
    const double t = std::log(tokens_per_expert / a.tokens_per_expert) /
                     std::log(b.tokens_per_expert / a.tokens_per_expert);
    return a.*rate + t * (b.*rate - a.*rate);
  }
  return points.back().*rate;
}

// --- What the presets are derived from (docs/cost_model.md, "Presets") ---
// The team's H200 machine (docs/benchmarks.md): 16 Sapphire Rapids cores with AMX computed a
// Qwen3-30B-A3B layer's forward (2048 tokens × 8 pairs over 128 experts: 128 tokens per expert)
// in 39 ms, 6·2048·768·16384 FLOP: 0.25 TFLOP/s a core; its backward took 1.2 times as long.
constexpr double kAmxFlopsPerCore = 0.25e12;
// AVX-512 BF16 without AMX: ENVIRONMENT.md measured bf16 at ~200 GFLOP/s on 2 threads (1 core)
// with AMX disabled, against 1.43 TFLOP/s with it: a seventh; rounded to 0.1 TFLOP/s a core.
constexpr double kAvx512Bf16FlopsPerCore = 0.1e12;
constexpr double kBackwardOverForward = 1.2;
// Sustained memory read per socket (STREAM-like, ~75 % of the channels' peak): Intel Xeon with
// AMX, 8 × DDR5-4800 (307 GB/s peak); AMD EPYC Genoa / Turin, 12 × DDR5-4800 (461 GB/s); older
// parts, 8 × DDR4-3200 (205 GB/s).
constexpr double kAmxSocketBytesPerS = 230e9;
constexpr double kEpycDdr5SocketBytesPerS = 345e9;
constexpr double kDdr4SocketBytesPerS = 150e9;
// bf16 tensor-core peak (dense, fp32 accumulate) from NVIDIA's data sheets, and HBM / GDDR
// bandwidth. Scaled by what the H200 achieved in libtorch: 807 of 989 TFLOP/s.
struct GpuSpecSheet {
  std::string_view name_part;
  double bf16_flops_per_s;
  double memory_bytes_per_s;
};
constexpr GpuSpecSheet kGpuSheets[] = {
    {"H200", 989e12, 4.8e12},        {"H100", 989e12, 3.35e12},     {"RTX 5090", 209.5e12, 1.79e12},
    {"RTX 4090", 165.2e12, 1.01e12}, {"A6000", 154.8e12, 0.768e12},
};
constexpr double kGpuGemmEfficiency = 807.0 / 989.0;
// PCIe payload per lane and generation (after encoding), scaled by the H200's measured pinned
// host → device copy: 54 GB/s of the 63 GB/s of Gen 5 x16.
constexpr double kLaneBytesPerS[] = {0, 0.25e9, 0.5e9, 0.985e9, 1.969e9, 3.938e9, 7.877e9};
constexpr double kPcieEfficiency = 54.0 / 63.0;
constexpr double kPresetTokensPerExpert[] = {1, 8, 64, 512};

// min(compute peak, weight stream): a product of `tokens` rows by an expert's weights reads the
// weights once, `bytes_per_weight` each.
RateCurve rooflineCurve(double peak_flops_per_s, double weight_bytes_per_s, double bytes_per_weight,
                        double backward_over_forward) {
  RateCurve curve;
  for (const double n : kPresetTokensPerExpert) {
    // 2 FLOP per weight and token against bytes_per_weight per weight once.
    const double forward =
        std::min(peak_flops_per_s, 2.0 * n * weight_bytes_per_s / bytes_per_weight);
    curve.points.push_back({n, forward, forward / backward_over_forward});
  }
  return curve;
}

const GpuSpecSheet* sheetFor(const std::string& name) {
  for (const GpuSpecSheet& s : kGpuSheets) {
    if (name.find(s.name_part) != std::string::npos) return &s;
  }
  return nullptr;
}

}  // namespace

double RateCurve::forwardRate(double tokens_per_expert) const {
  return interpolate(points, tokens_per_expert, &RatePoint::forward_flops_per_s);
}

double RateCurve::backwardRate(double tokens_per_expert) const {
  return interpolate(points, tokens_per_expert, &RatePoint::backward_flops_per_s);
}

const ExpertEngineRates* MachineRates::cpuFor(const std::string& format) const {
  for (const ExpertEngineRates& r : cpu) {
    if (r.format == format) return &r;
  }
  return cpu.empty() ? nullptr : &cpu.front();
}

const GpuRates* MachineRates::gpu(int index) const {
  for (const GpuRates& g : gpus) {
    if (g.index == index) return &g;
  }
  return nullptr;
}

MachineRates presetRates(const Hardware& hardware) {
  MachineRates rates;
  rates.source = "preset " + hardware.name + " (derived from specs)";
  const CpuSpec& cpu = hardware.cpu;
  const int sockets = std::max(1, cpu.sockets);
  const double socket_bytes = cpu.amx_bf16                             ? kAmxSocketBytesPerS
                              : cpu.avx512_bf16 && cpu.vendor == "amd" ? kEpycDdr5SocketBytesPerS
                                                                       : kDdr4SocketBytesPerS;
  rates.host_memory_bytes_per_s = socket_bytes * sockets;
  const double per_core = cpu.amx_bf16      ? kAmxFlopsPerCore
                          : cpu.avx512_bf16 ? kAvx512Bf16FlopsPerCore
                                            : 0.0;
  if (per_core > 0 && cpu.physical_cores > 0) {
    const double peak = per_core * cpu.physical_cores;
    rates.cpu_dense_flops_per_s = peak;
    const std::string backend = cpu.amx_bf16 ? "amx_bf16" : "avx512_bf16";
    rates.cpu.push_back(
        {backend, "bf16",
         rooflineCurve(peak, rates.host_memory_bytes_per_s, 2.0, kBackwardOverForward)});
    // int8 halves the weight stream; AMX int8 runs at twice bf16's peak, kept at bf16's here
    // (the dequantising epilogue is not free): only the weight-bound end gains.
    rates.cpu.push_back(
        {cpu.amx_int8 ? "amx_int8" : backend, "int8",
         rooflineCurve(peak, rates.host_memory_bytes_per_s, 1.0, kBackwardOverForward)});
    rates.notes.push_back("CPU experts: " + std::to_string(cpu.physical_cores) + " cores × " +
                          std::to_string(per_core / 1e12).substr(0, 4) +
                          " TFLOP/s (measured per AMX core on the H200 machine), capped by " +
                          std::to_string(static_cast<int>(rates.host_memory_bytes_per_s / 1e9)) +
                          " GB/s of weight stream");
  } else {
    rates.notes.push_back("CPU experts: no rate for a CPU without AMX or AVX-512 BF16");
  }
  for (const GpuSpec& g : hardware.gpus) {
    const GpuSpecSheet* sheet = sheetFor(g.name);
    const int generations = static_cast<int>(std::size(kLaneBytesPerS));
    if (!sheet || g.pcie_gen <= 0 || g.pcie_gen >= generations || g.pcie_lanes <= 0) {
      rates.notes.push_back("cuda:" + std::to_string(g.index) + " (" + g.name +
                            "): no published rates known, no GPU terms");
      continue;
    }
    GpuRates r;
    r.index = g.index;
    r.name = g.name;
    r.host_to_device_bytes_per_s = kLaneBytesPerS[g.pcie_gen] * g.pcie_lanes * kPcieEfficiency;
    r.device_to_host_bytes_per_s = r.host_to_device_bytes_per_s;
    const double peak = sheet->bf16_flops_per_s * kGpuGemmEfficiency;
    // The backward's dX product runs at the forward's rate on a GPU (no Wᵀ repack).
    r.expert_gemm = rooflineCurve(peak, sheet->memory_bytes_per_s, 2.0, 1.0);
    r.dense_flops_per_s = peak;
    rates.gpus.push_back(r);
  }
  return rates;
}

}  // namespace tandem::placement
