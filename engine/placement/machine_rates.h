#pragma once
// MachineRates: how fast this machine's resources run the parts of a training step, as plain
// numbers the cost model (step_cost.h) and the per-expert split (expert_split_policy.h) read.
// Measured at start-up by engine/model/cost_calibration.h (about a second, cached per machine in
// cacheDir()/calibration, see calibration_cache.h), or derived from a hardware preset's published
// specs and the team's H200 measurements (presetRates) for a machine we cannot measure.
//
// Rates are FLOP/s or bytes/s. The expert engine's and the GPU's expert GEMM rates depend on the
// tokens each expert gets (few tokens: a weight-bound matrix-vector product; many: compute-bound),
// so they are curves: a few (tokens per expert, rate) points, interpolated in log(tokens) and
// clamped at the ends. No libtorch here.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/placement/hardware.h"

namespace tandem::placement {

// One measured point: a gated expert (gate, up, down) computing `tokens_per_expert` tokens. Both
// rates count 6·H·I FLOP per token: the frozen base weights' backward is the dX product only (the
// LoRA terms ride along), so forward and backward do the same base work and the rates compare.
struct RatePoint {
  double tokens_per_expert = 0;
  double forward_flops_per_s = 0;
  double backward_flops_per_s = 0;
};

// Rate as a function of tokens per expert.
struct RateCurve {
  std::vector<RatePoint> points;  // ascending tokens_per_expert, rates > 0

  bool empty() const { return points.empty(); }
  // FLOP/s at `tokens_per_expert` (> 0): log-linear between points, the end points' rate outside.
  double forwardRate(double tokens_per_expert) const;
  double backwardRate(double tokens_per_expert) const;
};

// The CPU expert engine with one backend and weight format (ExpertLayer's names: "amx_bf16",
// "avx512_bf16", ...; format "bf16", "int8", ...).
struct ExpertEngineRates {
  std::string backend;
  std::string format;
  RateCurve curve;
  // A call's fixed cost whatever its tokens (routing, task set-up, buffer leases), milliseconds:
  // what dominates a small model's layers. Measured with one token; 0 when not measured.
  double forward_call_ms = 0;
  double backward_call_ms = 0;
};

struct GpuRates {
  int index = 0;                          // cuda:<index>
  std::string name;                       // "NVIDIA H200"
  double host_to_device_bytes_per_s = 0;  // pinned
  double device_to_host_bytes_per_s = 0;  // pinned
  RateCurve expert_gemm;                  // bf16 [tokens, H] × [H, I] products of one expert
  double dense_flops_per_s = 0;           // bf16 attention / dense projections of a layer
};

struct MachineRates {
  std::string source;  // "calibrated", "cache", or "preset <name> (derived from specs)"
  std::vector<ExpertEngineRates> cpu;  // empty: no CPU expert rate known
  double host_memory_bytes_per_s = 0;  // the fused CPU AdamW's stream over the expert LoRA
  // bf16 dense products (attention, dense MLPs) run by libtorch on the CPU: what a machine
  // without a GPU computes its dense parts at. 0: unknown.
  double cpu_dense_flops_per_s = 0;
  std::vector<GpuRates> gpus;  // empty on a machine without a GPU: no GPU terms
  // How the numbers were obtained, one line each (presets: which spec and which measurement).
  std::vector<std::string> notes;

  // The engine's rates for `format` ("bf16", "int8", ...); the first one listed when that format
  // was not measured; nullptr when none was.
  const ExpertEngineRates* cpuFor(const std::string& format) const;
  const GpuRates* gpu(int index) const;
};

// Rates for a machine that cannot be measured here, from its preset (CPU cores, AMX, sockets,
// GPU names and PCIe links) and published specs, scaled by what the team measured on its H200
// machine (docs/cost_model.md says how). A GPU the table does not know has no rates (nullopt
// for its terms); so does a CPU without AVX-512 BF16 or AMX.
MachineRates presetRates(const Hardware& hardware);

}  // namespace tandem::placement
