#pragma once
// Rough time estimates for the routed experts a GPU does not hold, per MoE layer and training
// step: computed by the CPU expert engine, or streamed to the GPU (offload mode's resident cache).
// They let the planner say which of the two a machine favours, from rates measured on the team's
// H200 machine (docs/benchmarks.md): 16 Sapphire Rapids cores with AMX computed a Qwen3-30B-A3B
// layer's forward (2048 tokens × 8 pairs) in 39 ms and its backward in 47 ms; pinned host → H200
// copies over PCIe 5.0 x16 ran at ~55 GB/s. Estimates, not measurements: nullopt where no rate
// was measured (CPUs without AMX, an unknown PCIe link).

#include <cstdint>
#include <optional>
#include <string>

#include "engine/io/model_config.h"
#include "engine/placement/hardware.h"

namespace tandem::placement {

// The CPU engine computing `cpu_share` (0..1) of a layer's tokens × top_k pairs, forward and
// backward, plus the forward once more when the checkpointing recomputation runs the experts
// again (`recomputed`: not kept in host RAM). Milliseconds.
std::optional<double> cpuExpertsMs(const io::ModelConfig& model, int64_t tokens, double cpu_share,
                                   const CpuSpec& cpu, bool recomputed);

// `flops` of bf16 matrix products on `cores` of `cpu` at the measured AMX rate (the experts' rate,
// taken for dense layers placed on the CPU too). Milliseconds; nullopt without AMX.
std::optional<double> cpuMatmulMs(double flops, int cores, const CpuSpec& cpu);

// `experts` experts of a layer streamed in `weight_format` (int8: with their row scales; else the
// model dtype, `bf16` or fp32) twice a step (forward, and the recomputation or the backward).
// Milliseconds.
std::optional<double> streamedExpertsMs(const io::ModelConfig& model, int64_t experts,
                                        const std::string& weight_format, bool bf16,
                                        const GpuSpec& gpu);

}  // namespace tandem::placement
