// experts_mode auto's memory (Evaluator::chargeSplitExperts), against the hand formula: a host
// copy of every expert per MoE layer, two layers' streamed experts on the GPU, each layer's
// incoming resident cache when the cache is re-placed, and the CPU engine's packs of every expert.

#include <gtest/gtest.h>

#include "engine/placement/memory_planner.h"

namespace tandem::placement {
namespace {

namespace fs = std::filesystem;
const fs::path kPresets = fs::path(TANDEM_PRESETS_DIR);

// Qwen3-30B-A3B: 48 MoE layers of 128 experts, H 2048, I 768.
constexpr uint64_t H = 2048, I = 768, E = 128, kLayers = 48;
constexpr uint64_t kBf16Expert = 3 * H * I * 2;
constexpr uint64_t kInt8Expert = 3 * H * I + (2 * I + H) * 4;  // with the fp32 row scales

PlanRequest qwen3(const char* format, int64_t gpu_experts, bool split) {
  PlanRequest r;
  r.model = io::readModelConfig(kPresets / "models" / "qwen3-30b-a3b.json");
  r.expert_weight_format = format;
  r.gpu_experts = gpu_experts;
  r.split_experts = split;
  return r;
}

Hardware workstation() {
  return resolveHardware("1x4090-24g_xeon-w7-spr_256g", kPresets / "hardware");
}

// The bytes of the items named `what` on the GPUs (gpu true) or on the host nodes.
uint64_t item(const MemoryPlan& plan, const std::string& what, bool gpu) {
  uint64_t bytes = 0;
  for (const DevicePlan& d : plan.devices) {
    if (d.device.isGpu() != gpu) continue;
    for (const PlanItem& i : d.items) bytes += i.what == what ? i.bytes : 0;
  }
  return bytes;
}

TEST(SplitExpertsMemory, ChargesTheHostCopyTheStreamedExpertsAndTheIncomingCache) {
  const MemoryPlan split = planMemory(qwen3("bf16", 10, true), workstation());
  EXPECT_EQ(item(split, "auto: host copy of the experts", false), kLayers * E * kBf16Expert);
  EXPECT_EQ(item(split, "auto: streamed experts (2 layers)", true), 2 * (E - 10) * kBf16Expert);
  EXPECT_EQ(item(split, "auto: incoming resident experts", true), kLayers * 10 * kBf16Expert);
  // The CPU engine packs every expert in auto mode, the non-resident ones only beside it.
  const MemoryPlan co = planMemory(qwen3("bf16", 10, false), workstation());
  EXPECT_EQ(item(split, "routed experts bf16", false), kLayers * E * kBf16Expert);
  EXPECT_EQ(item(co, "routed experts bf16", false), kLayers * (E - 10) * kBf16Expert);
  EXPECT_EQ(item(co, "auto: host copy of the experts", false), 0u);
  EXPECT_EQ(item(co, "auto: streamed experts (2 layers)", true), 0u);
  // The rest of the plan is the same.
  EXPECT_EQ(item(split, "resident routed experts", true),
            item(co, "resident routed experts", true));
}

TEST(SplitExpertsMemory, Int8ExpertsAreStreamedAsInt8AndCastOnTheGpu) {
  PlanRequest r = qwen3("int8", 10, true);
  r.split_refresh = false;  // resident_refresh_steps: 0, the first call's cache stays
  const MemoryPlan plan = planMemory(r, workstation());
  EXPECT_EQ(item(plan, "auto: host copy of the experts", false), kLayers * E * kInt8Expert);
  EXPECT_EQ(item(plan, "auto: streamed experts (2 layers)", true),
            2 * (E - 10) * kInt8Expert + (E - 10) * 3 * H * I * 2);
  EXPECT_EQ(item(plan, "auto: incoming resident experts", true), 0u);
}

// The planner's resident count makes room for what auto adds on the GPU: fewer experts than beside
// the CPU engine, and the plan still within the fill line.
TEST(SplitExpertsMemory, TheAutoResidentCountLeavesRoomForTheSplit) {
  const MemoryPlan split = planMemory(qwen3("bf16", kAutoGpuExperts, true), workstation());
  const MemoryPlan co = planMemory(qwen3("bf16", kAutoGpuExperts, false), workstation());
  ASSERT_TRUE(split.fits);
  const int64_t n_split = split.placement.find("model.layers.0.mlp.experts")->gpu_experts;
  const int64_t n_co = co.placement.find("model.layers.0.mlp.experts")->gpu_experts;
  EXPECT_LT(n_split, n_co);
  const DevicePlan& gpu = *split.device(Device::cuda(0));
  EXPECT_LE(static_cast<double>(gpu.total()),
            kGpuExpertsFill * static_cast<double>(gpu.capacity_bytes));
}

// Where every expert fits on the GPU, auto holds them all, as resident mode does: a cache of
// every expert is never re-placed, so it needs no incoming copy (the V2-Lite run on the H200:
// auto's planned cache was a little over half of resident mode's, and it streamed the rest).
TEST(SplitExpertsMemory, AutoHoldsEveryExpertWhereTheyAllFit) {
  PlanRequest split = qwen3("bf16", kAutoGpuExperts, true);
  split.model.num_hidden_layers = 8;  // 8 x 128 bf16 experts: 9.7 GB, twice that does not fit
  const MemoryPlan plan = planMemory(split, workstation());
  ASSERT_TRUE(plan.fits);
  EXPECT_EQ(plan.placement.find("model.layers.0.mlp.experts")->gpu_experts,
            static_cast<int64_t>(E));
  EXPECT_EQ(item(plan, "auto: incoming resident experts", true), 0u);
  EXPECT_EQ(item(plan, "auto: streamed experts (2 layers)", true), 0u);
  EXPECT_EQ(item(plan, "resident routed experts", true), 8 * E * kBf16Expert);
}

// Without a GPU auto runs as cpu mode: nothing of the split is charged.
TEST(SplitExpertsMemory, WithoutAGpuNothingIsCharged) {
  Hardware cpu_only = workstation();
  cpu_only.gpus.clear();
  const MemoryPlan plan = planMemory(qwen3("bf16", 0, true), cpu_only);
  EXPECT_EQ(item(plan, "auto: host copy of the experts", false), 0u);
  EXPECT_EQ(item(plan, "routed experts bf16", false), kLayers * E * kBf16Expert);
}

// Issue 28's H200 run: Qwen3-30B-A3B at 48 layers, int8 experts, auto with the planner's resident
// count, the GPU capped at 24 GiB, on the 128 GB single-H200 machine. The host holds the CPU
// engine's int8 packs of every expert (forward and persistent Wᵀ: 2 × 29 GB), auto's host copy
// (29 GB, one exactly sized pinned block per layer) and the rest: the plan must say it fits.
TEST(SplitExpertsMemory, Qwen3At48LayersInInt8FitsTheSingleH200Machine) {
  Hardware h200 = resolveHardware("1xh200_xeon-16c_128g", kPresets / "hardware");
  for (GpuSpec& gpu : h200.gpus) gpu.free_bytes = std::min<uint64_t>(gpu.free_bytes, 24ull << 30);
  PlanRequest r = qwen3("int8", kAutoGpuExperts, true);
  r.cutoff_len = 2048;
  r.gradient_checkpointing = true;
  const MemoryPlan plan = planMemory(r, h200);
  std::string problems;
  for (const std::string& p : plan.problems) problems += p + "; ";
  EXPECT_TRUE(plan.fits) << problems;
  EXPECT_EQ(item(plan, "auto: host copy of the experts", false), kLayers * E * kInt8Expert);
  // With the packs, the copy is the bulk of the host's plan, which stays under the 128 GB.
  EXPECT_GT(plan.hostBytes(), 3 * kLayers * E * kInt8Expert);
  EXPECT_LT(plan.hostBytes(), 128ull * 1000 * 1000 * 1000);
}

}  // namespace
}  // namespace tandem::placement
