#include "engine/placement/step_time_estimate.h"

#include <gtest/gtest.h>

namespace tandem::placement {
namespace {

namespace fs = std::filesystem;
const fs::path kPresets = fs::path(TANDEM_PRESETS_DIR);

// Qwen3-30B-A3B on two 4090s and two 56-core Sapphire Rapids: 48 MoE layers, 128 experts of
// H 2048 × I 768, top-8; 2048 tokens a step.
struct Qwen3OnTwo4090s : ::testing::Test {
  void SetUp() override {
    request.model = io::readModelConfig(kPresets / "models" / "qwen3-30b-a3b.json");
    request.cutoff_len = 2048;
    request.batch_size = 1;
    hardware = resolveHardware("2x4090-24g_xeon-spr-2s_512g", kPresets / "hardware");
  }
  // The hand formula: 2 · 3 · H · I FLOP per routed pair, forward + 1.2 × it backward (+ the
  // recomputation), at 0.25 TFLOP/s per AMX core (expert_time_estimate.cpp's measured rate).
  double expertsMs(double pairs_share, int cores, bool recomputed) const {
    const double forward = 2.0 * 3 * 2048 * 768 * 2048.0 * 8 * pairs_share;
    return 1e3 * (2.2 + (recomputed ? 1 : 0)) * forward / (0.25e12 * cores);
  }
  PlanRequest request;
  Hardware hardware;
};

TEST_F(Qwen3OnTwo4090s, ExpertEngineTimeFollowsTheResidentShare) {
  request.gpu_experts = 0;
  const MemoryPlan none = planMemory(request, hardware);
  const std::optional<StepTimeEstimate> all_cpu = estimateStepTime(request, hardware, none);
  ASSERT_TRUE(all_cpu.has_value());
  const bool recomputed = !none.keep_expert_forward;
  EXPECT_NEAR(all_cpu->expert_engine_ms, 48 * expertsMs(1.0, 112, recomputed), 1e-6);
  EXPECT_EQ(all_cpu->cpu_dense_ms, 0);
  EXPECT_NEAR(all_cpu->tokens_per_s, 2048 * 1e3 / all_cpu->step_ms, 1e-9);

  // 32 of 128 experts resident on every layer's GPU: the CPU computes three quarters of the pairs.
  request.gpu_experts = 32;
  const MemoryPlan resident = planMemory(request, hardware);
  const std::optional<StepTimeEstimate> quarter = estimateStepTime(request, hardware, resident);
  ASSERT_TRUE(quarter.has_value());
  EXPECT_NEAR(quarter->expert_engine_ms, 48 * expertsMs(0.75, 112, !resident.keep_expert_forward),
              1e-6);
  EXPECT_GT(quarter->tokens_per_s, all_cpu->tokens_per_s);
}

TEST_F(Qwen3OnTwo4090s, DenseLayersOnTheCpuAndExpertsOnOneNodeCostTheirShare) {
  request.gpu_experts = 0;
  const MemoryPlan planned = planMemory(request, hardware);
  const StepTimeEstimate before = estimateStepTime(request, hardware, planned).value();
  // Layer 5's attention, router and shared parts on node 0, its experts on node 1 alone.
  Placement moved = planned.placement;
  int64_t dense_params = 0;
  for (ModulePlacement& m : moved.modules) {
    if (m.layer != 5) continue;
    if (m.kind == ModuleKind::RoutedExperts) {
      m.device = Device::numaNode(1);
    } else {
      m.device = Device::numaNode(0);
      dense_params += moduleParameters(request.model, m);
    }
  }
  const MemoryPlan after_plan = evaluatePlacement(request, hardware, moved);
  const StepTimeEstimate after = estimateStepTime(request, hardware, after_plan).value();
  // 56 of the 112 cores; checkpointing: forward, dX, dW and the recomputation.
  EXPECT_NEAR(after.cpu_dense_ms, 1e3 * 2 * 4 * dense_params * 2048.0 / (0.25e12 * 56), 1e-6);
  const bool recomputed = !after_plan.keep_expert_forward;
  EXPECT_NEAR(after.expert_engine_ms,
              47 * expertsMs(1.0, 112, recomputed) + expertsMs(1.0, 56, recomputed), 1e-6);
  EXPECT_LT(after.tokens_per_s, before.tokens_per_s);
}

TEST_F(Qwen3OnTwo4090s, NoMeasuredRateWithoutAmx) {
  hardware.cpu.amx_bf16 = hardware.cpu.amx_int8 = false;
  EXPECT_FALSE(estimateStepTime(request, hardware, planMemory(request, hardware)).has_value());
}

}  // namespace
}  // namespace tandem::placement
