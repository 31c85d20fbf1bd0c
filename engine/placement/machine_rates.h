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
  // What the GPU's routed experts cost beyond the products the calibration times (its matmuls
  // are one expert's GEMMs back to back). Not measured at start-up: constants fitted to the H200
  // runs (machine_rates.cpp says which run; docs/cost_model.md "Fitted terms"), the same for
  // every GPU until a calibration measures them.
  // Per expert computed on the GPU per pass: its group's gather of the tokens, the SiLU and
  // row-scale products, the weighted scatter back, the LoRA slices and the launches of each.
  double expert_overhead_ms = kFittedExpertOverheadMs;
  // int8 / int4 weights are made bf16 on the device for each pass that computes them: bytes
  // written (2 per weight) per second.
  double weight_cast_bytes_per_s = kFittedWeightCastBytesPerS;
  // A streamed expert's device-side cost beyond the copy engine's transfer: offload mode's
  // staging of a layer's experts as one block, bytes streamed per second of GPU time; the split's
  // per expert and pass (its experts are staged one by one).
  double offload_staging_bytes_per_s = kFittedOffloadStagingBytesPerS;
  double split_streamed_expert_ms = kFittedSplitStreamedExpertMs;
  // The split's CPU engine call beside the GPU's, per pass when any expert stays on the CPU: the
  // call walks every (token, slot) pair of the layer (the GPU's masked), beyond the calibrated
  // one-token call.
  double split_cpu_call_ms = kFittedSplitCpuCallMs;
  // Per MoE layer and pass: the routing's round trip to the host (the grouping and the split
  // are built there), during which the GPU waits.
  double layer_sync_ms = kFittedLayerSyncMs;

  // Sets the fitted terms above to 0: rates that price the products and copies alone (tests
  // that write a split's times out by hand).
  void clearFittedTerms() {
    expert_overhead_ms = weight_cast_bytes_per_s = offload_staging_bytes_per_s = 0;
    split_streamed_expert_ms = split_cpu_call_ms = layer_sync_ms = 0;
  }

  // Fitted to the H200 machine's e2e runs of DeepSeek-V2-Lite shapes, int8 experts, 2048 tokens,
  // checkpointing, GPU capped at 24 GiB (bench/results/cost_model_h200_v2lite_{8,27}l.json: the
  // lead's runs of 2026-12-03, main 5d273ba and auto2 2bf1f27), each with the run's own
  // calibrated rates: the constants that bring every mode's prediction within 15 % of measured
  // (engine/placement/recorded_runs_test.cpp holds them there).
  // GPU busy beyond the GEMMs with all 64 experts resident: 255 ms for 26 layers × 3 passes × 64
  // experts over the products the calibration timed (27 layers, resident mode), 78 of 91 ms at 8.
  static constexpr double kFittedExpertOverheadMs = 0.011;
  // Not fitted: ~60 % of the H200's 4.8 TB/s HBM, what a plain elementwise cast reaches.
  static constexpr double kFittedWeightCastBytesPerS = 3e12;
  // Offload mode's GPU busy beyond resident mode's: 513 against 255 ms for 50 layer copies of 64
  // int8 experts (17.3 MB each as bf16), 346 for int4 (4.6 MB each, packed).
  static constexpr double kFittedOffloadStagingBytesPerS = 280e9;
  // auto at 27 layers (35 resident, 25 streamed, 4 on the CPU per layer): 866 ms of GPU busy
  // against 196 predicted for the products: 0.34 ms per streamed expert and pass; the CPU
  // engine busy 640 ms for the 4 experts' ~240 ms of products: 7.75 ms more per call. The step
  // (1.2 s) matches when the streamed experts' staging precedes the CPU engine's call.
  static constexpr double kFittedSplitStreamedExpertMs = 0.34;
  static constexpr double kFittedSplitCpuCallMs = 7.75;
  // Step over GPU busy with every expert resident: 330 − 255 ms over 78 layer passes at 27
  // layers, 91 − 78 ms over 21 at 8.
  static constexpr double kFittedLayerSyncMs = 0.8;
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
