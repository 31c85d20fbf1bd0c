// Issue 27 item 3: the planner's bytes for routed experts a GPU holds or offload mode streams as
// Tandem int4 tables (model::StoredExpertWeights), counted by hand from the table layout.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <tuple>

#include "engine/placement/memory_model.h"
#include "engine/placement/memory_planner.h"

namespace tandem::placement {
namespace {

namespace fs = std::filesystem;
const fs::path kPresets = fs::path(TANDEM_PRESETS_DIR);

PlanRequest qwen3(const std::string& format, const std::string& backend, int64_t gpu_experts) {
  PlanRequest r;
  r.model = io::readModelConfig(kPresets / "models" / "qwen3-30b-a3b.json");
  r.cutoff_len = 2048;
  r.batch_size = 1;
  r.expert_weight_format = format;
  r.experts_backend = backend;
  r.gpu_experts = gpu_experts;
  return r;
}

Hardware rtx4090() { return resolveHardware("1x4090-24g_xeon-w7-spr_256g", kPresets / "hardware"); }

uint64_t item(const MemoryPlan& plan, Device device, const std::string& what) {
  uint64_t bytes = 0;
  for (const PlanItem& i : plan.device(device)->items) bytes += i.what == what ? i.bytes : 0;
  return bytes;
}

// Qwen3-30B-A3B: H 2048, I 768, 128 experts, 48 MoE layers. One expert's int4 tables: gate and up
// I rows of H / G blocks, down H rows of I / G blocks; a block is G / 2 bytes of nibbles and an
// f16 scale (and an f16 minimum when asymmetric).
constexpr uint64_t kH = 2048, kI = 768, kExperts = 128, kLayers = 48;
uint64_t int4Expert(uint64_t group, bool symmetric) {
  const uint64_t block = group / 2 + (symmetric ? 2 : 4);
  return (2 * kI * (kH / group) + kH * (kI / group)) * block;
}

TEST(GpuExpertFormat, Int8AndInt4StayQuantisedTheRestIsTheModelDtype) {
  EXPECT_EQ(memory::gpuExpertFormat("int8", true), "int8");
  EXPECT_EQ(memory::gpuExpertFormat("int4", true), "int4");
  EXPECT_EQ(memory::gpuExpertFormat("int4:g64:asym", false), "int4:g64:asym");
  EXPECT_EQ(memory::gpuExpertFormat("q4_k", true), "bf16");
  EXPECT_EQ(memory::gpuExpertFormat("fp8", false), "fp32");
  EXPECT_EQ(memory::gpuExpertFormat("bf16", true), "bf16");
  const io::ModelConfig m = qwen3("int4", "auto", 0).model;
  EXPECT_EQ(memory::residentExpertBytes(m, "int4", true), int4Expert(32, true));
  EXPECT_EQ(memory::residentExpertBytes(m, "int4:g128:asym", true), int4Expert(128, false));
  // 0.5625 bytes a weight at group 32: under a third of bf16's, a bit over half of int8's.
  EXPECT_LT(memory::residentExpertBytes(m, "int4", true) * 3,
            memory::residentExpertBytes(m, "bf16", true));
}

// Resident int4 experts: their tables on the GPU and one layer's dequantised copy while it
// computes; the count auto fits on the card is about int8's times 1.8 (int4's 0.56 bytes a weight
// against int8's 1 + its row scales).
TEST(MemoryPlanner, Int4ResidentExpertsAreTheirTablesBytes) {
  const Hardware hw = rtx4090();
  const MemoryPlan int4 = planMemory(qwen3("int4", "auto", 10), hw);
  EXPECT_EQ(item(int4, Device::cuda(0), "resident routed experts"),
            10 * kLayers * int4Expert(32, true));
  EXPECT_EQ(item(int4, Device::cuda(0), "resident int4 experts dequantised"),
            10 * 3 * kH * kI * 2);  // bf16
  auto autoCount = [&](const char* format) {
    return planMemory(qwen3(format, "auto", kAutoGpuExperts), hw)
        .placement.find("model.layers.0.mlp.experts")
        ->gpu_experts;
  };
  const int64_t n_int8 = autoCount("int8"), n_int4 = autoCount("int4");
  EXPECT_GT(n_int8, 8);
  EXPECT_GE(n_int4, n_int8 * 3 / 2);
}

// Offload mode streaming int4: the pinned host copy is every expert's tables (also with a
// resident cache), the GPU's buffers two layers' tables of the streamed experts and the computing
// layer's dequantised copy.
TEST(MemoryPlanner, Int4OffloadCountsItsTablesPinnedAndStreamed) {
  const Hardware hw = rtx4090();
  for (const auto& [format, group, symmetric] :
       {std::tuple{"int4", 32, true}, std::tuple{"int4:g128:asym", 128, false}}) {
    SCOPED_TRACE(format);
    const uint64_t layer = kExperts * int4Expert(static_cast<uint64_t>(group), symmetric);
    const uint64_t layer_bf16 = kExperts * 3 * kH * kI * 2;
    const MemoryPlan streamed = planMemory(qwen3(format, "gpu-offload", 0), hw);
    EXPECT_EQ(item(streamed, Device::cpu(), std::string("routed experts ") + format),
              kLayers * layer);
    EXPECT_EQ(item(streamed, Device::cuda(0), "offload buffers"), 2 * layer + layer_bf16);
    const MemoryPlan cached = planMemory(qwen3(format, "gpu-offload", 32), hw);
    EXPECT_EQ(item(cached, Device::cpu(), std::string("routed experts ") + format),
              kLayers * layer);
    EXPECT_EQ(item(cached, Device::cuda(0), "offload buffers"),
              (2 * layer + layer_bf16) / kExperts * (kExperts - 32));
    EXPECT_EQ(item(cached, Device::cuda(0), "resident routed experts"),
              32 * kLayers * layer / kExperts);
  }
  // int8 for scale: int4's streamed bytes are 0.56 of int8's.
  const MemoryPlan int8 = planMemory(qwen3("int8", "gpu-offload", 0), hw);
  const MemoryPlan int4 = planMemory(qwen3("int4", "gpu-offload", 0), hw);
  EXPECT_LT(item(int4, Device::cpu(), "routed experts int4") * 10,
            item(int8, Device::cpu(), "routed experts int8") * 6);
}

}  // namespace
}  // namespace tandem::placement
