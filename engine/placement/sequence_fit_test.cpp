// The planner against cutoff_len (issue 29): bytes grow with the sequence, offloading the
// checkpoints moves bytes from the GPU to the host, MoE token chunks bound the expert buffers,
// and the longest length that fits is a boundary (it fits, one step more does not).

#include "engine/placement/sequence_fit.h"

#include <gtest/gtest.h>

#include "engine/placement/memory_model.h"

namespace tandem::placement {
namespace {

namespace fs = std::filesystem;
const fs::path kPresets = fs::path(TANDEM_PRESETS_DIR);
constexpr uint64_t kGiB = uint64_t{1} << 30;

PlanRequest request(const char* model_file, int64_t cutoff_len) {
  PlanRequest r;
  r.model = io::readModelConfig(kPresets / "models" / model_file);
  r.cutoff_len = cutoff_len;
  r.gpu_experts = 0;
  return r;
}

// The team's H200 test machine with its GPU capped at 24 GiB (the e2e bench's --gpu-cap-gib 24).
Hardware h200Capped24() {
  Hardware hw = resolveHardware("1xh200_xeon-16c_128g", kPresets / "hardware");
  hw.gpus.at(0).free_bytes = 24 * kGiB;
  return hw;
}

uint64_t gpuBytes(const MemoryPlan& plan) { return plan.device(Device::cuda(0))->total(); }

uint64_t item(const MemoryPlan& plan, Device device, const std::string& what) {
  uint64_t bytes = 0;
  for (const PlanItem& i : plan.device(device)->items) bytes += i.what == what ? i.bytes : 0;
  return bytes;
}

TEST(SequenceFit, PeaksGrowWithCutoffLen) {
  const Hardware hw = h200Capped24();
  for (const bool offload : {false, true}) {
    PlanRequest r = request("qwen3-30b-a3b.json", 2048);
    r.offload_checkpoints = offload;
    const MemoryPlan plan = planMemory(r, hw);
    uint64_t gpu = 0, host = 0;
    MemoryPlan previous;
    for (int64_t len = 1024; len <= 131072; len *= 2) {
      const MemoryPlan at = planAtCutoff(r, hw, plan, len);
      EXPECT_GT(gpuBytes(at), gpu) << len << (offload ? " offloaded" : "");
      // The host grows too, unless the planner traded the kept expert forward or the persistent
      // W^T for room (planMemory's choices, which shrink it).
      if (at.keep_expert_forward == previous.keep_expert_forward &&
          at.transposed_weights == previous.transposed_weights) {
        EXPECT_GT(at.hostBytes(), host) << len << (offload ? " offloaded" : "");
      }
      gpu = gpuBytes(at);
      host = at.hostBytes();
      previous = at;
    }
  }
}

// Offloading moves the 48 layer inputs [S, H] bf16 to pinned host memory and keeps one on the GPU
// (at 16K, where every layer stays on the GPU either way).
TEST(SequenceFit, OffloadedCheckpointsMoveBytesFromGpuToHost) {
  const Hardware hw = h200Capped24();
  const int64_t S = 16384, H = 2048, layers = 48;
  PlanRequest on_gpu = request("qwen3-30b-a3b.json", S);
  PlanRequest offloaded = on_gpu;
  offloaded.offload_checkpoints = true;
  const MemoryPlan a = planMemory(on_gpu, hw), b = planMemory(offloaded, hw);
  ASSERT_EQ(a.placement.layerDevices(), b.placement.layerDevices());
  ASSERT_EQ(a.keep_expert_forward, b.keep_expert_forward);
  const uint64_t input = static_cast<uint64_t>(S * H * 2);
  EXPECT_EQ(item(a, Device::cuda(0), "layer activations"), layers * input);
  EXPECT_EQ(item(b, Device::cuda(0), "layer activations"), 0u);
  // The next layer's input on its way (the working layer's is in "recompute").
  EXPECT_EQ(item(b, Device::cuda(0), "checkpoint prefetch"), input);
  EXPECT_EQ(item(b, Device::cpu(), "offloaded checkpoints"), layers * input);
  // What left the GPU (with the allocator's 10 % cache margin) and what the host took.
  const uint64_t moved = (layers - 1) * input;
  EXPECT_NEAR(static_cast<double>(gpuBytes(a) - gpuBytes(b)), moved * 1.1, moved * 0.001);
  EXPECT_EQ(b.hostBytes() - a.hostBytes(), layers * input);
  // Offloading implies checkpointing: without it asked, the plan is the same.
  offloaded.gradient_checkpointing = false;
  EXPECT_EQ(gpuBytes(planMemory(offloaded, hw)), gpuBytes(b));
}

// The expert scratch [P, H] f32 of one MoE pass is per token chunk: a quarter of the chunk, a
// quarter of the scratch, whatever the sequence.
TEST(SequenceFit, MoeTokenChunkBoundsTheExpertScratch) {
  const Hardware hw = h200Capped24();
  PlanRequest r = request("qwen3-30b-a3b.json", 65536);
  r.offload_checkpoints = true;
  const uint64_t auto_chunk = item(planMemory(r, hw), Device::cpu(), "expert scratch");
  r.moe_token_chunk = kAutoMoeTokenChunk / 4;
  const uint64_t quarter = item(planMemory(r, hw), Device::cpu(), "expert scratch");
  ASSERT_GT(quarter, 0u);
  EXPECT_EQ(auto_chunk, 4 * quarter);
  // One pass of 8192 tokens, top-8, H 2048, f32: the forward's per-pair output.
  EXPECT_GE(auto_chunk, uint64_t{8192} * 8 * 2048 * 4);
  EXPECT_EQ(memory::moeChunkTokens(1000, 0), 1000);
  EXPECT_EQ(memory::moeChunkTokens(100000, 0), kAutoMoeTokenChunk);
}

// The dense MLP (gpu::GatedMlp) runs in checkpointed chunks of moe_token_chunk tokens, and in
// offload mode the shared experts too: their [tokens, intermediate] products are one chunk's.
// DeepSeek-V2-Lite: layer 0 dense (intermediate 10944), layer 1 MoE with 2 shared experts (2816).
TEST(SequenceFit, DenseAndSharedMlpProductsAreOneChunks) {
  const io::ModelConfig lite = io::readModelConfig(kPresets / "models" / "deepseek-v2-lite.json");
  const int64_t T = 65536, chunk = 8192, b = 2;
  const uint64_t dense_saved = static_cast<uint64_t>((T - chunk) * 3 * 10944 * b);
  EXPECT_EQ(memory::layerActivationBytes(lite, 0, T, b),
            memory::layerActivationBytes(lite, 0, T, b, chunk) + dense_saved);
  EXPECT_EQ(memory::layerBackwardBytes(lite, 0, T, T, b),
            memory::layerBackwardBytes(lite, 0, T, chunk, b) + (T - chunk) * 2 * 10944 * b);
  // The shared experts: in chunks only when asked (offload mode).
  EXPECT_EQ(memory::layerActivationBytes(lite, 1, T, b, chunk),
            memory::layerActivationBytes(lite, 1, T, b));
  EXPECT_EQ(memory::layerActivationBytes(lite, 1, T, b),
            memory::layerActivationBytes(lite, 1, T, b, chunk, /*shared_in_chunks=*/true) +
                static_cast<uint64_t>((T - chunk) * 3 * 2816 * b));
  // A sequence within one chunk: as unchunked.
  EXPECT_EQ(memory::layerActivationBytes(lite, 0, 4096, b, chunk),
            memory::layerActivationBytes(lite, 0, 4096, b));
}

// Offload mode computes one MoE token chunk's pairs at a time (model::TorchExpertsCall in
// chunks): its GPU-side expert cache is the same at 16K and 64K, and the GPU peak grows by far
// less than the [pairs, moe_intermediate] products of the extra tokens would need.
TEST(SequenceFit, OffloadModesExpertBuffersAreOneChunks) {
  const Hardware hw = h200Capped24();
  PlanRequest r = request("deepseek-v2-lite.json", 16384);
  r.offload_checkpoints = true;
  r.experts_backend = "gpu-offload";
  const MemoryPlan plan = planMemory(r, hw);
  const MemoryPlan at64k = planAtCutoff(r, hw, plan, 65536);
  const uint64_t cache16k = item(plan, Device::cuda(0), "expert forward cache");
  ASSERT_GT(cache16k, 0u);
  EXPECT_EQ(item(at64k, Device::cuda(0), "expert forward cache"), cache16k);
  // One chunk: 8192 tokens' x [T, H] bf16, weights [P] f32, gate/up [P, I] f32 (top-6) and the
  // LoRA products (lora_target all: the experts' projections too).
  EXPECT_EQ(cache16k, memory::expertForwardCacheBytes(r.model, 8192, 2, r.lora_rank));
  // 64K fits the 24 GiB cap (the issue's run asks a peak under 22 GiB).
  EXPECT_TRUE(at64k.fits);
  EXPECT_LT(gpuBytes(at64k), 22 * kGiB) << gpuBytes(at64k);
}

void expectBoundary(const PlanRequest& r, const Hardware& hw) {
  const MemoryPlan plan = planMemory(r, hw);
  const SequenceFit fit = longestSequenceThatFits(r, hw, plan);
  ASSERT_GT(fit.longest_cutoff_len, 0);
  ASSERT_FALSE(fit.at_ceiling);
  EXPECT_EQ(fit.longest_cutoff_len % kSequenceStep, 0);
  EXPECT_TRUE(planAtCutoff(r, hw, plan, fit.longest_cutoff_len).fits);
  EXPECT_FALSE(planAtCutoff(r, hw, plan, fit.longest_cutoff_len + kSequenceStep).fits);
  EXPECT_LE(fit.longest_gpu_peak_bytes, 24 * kGiB);
}

TEST(SequenceFit, TheLongestThatFitsIsABoundary) {
  const Hardware hw = h200Capped24();
  PlanRequest qwen = request("qwen3-30b-a3b.json", 2048);
  expectBoundary(qwen, hw);
  qwen.offload_checkpoints = true;
  expectBoundary(qwen, hw);
  PlanRequest lite = request("deepseek-v2-lite.json", 2048);
  lite.offload_checkpoints = true;
  expectBoundary(lite, hw);
  lite.batch_size = 2;
  expectBoundary(lite, hw);
}

// Issue 29's targets: on 24 GiB, offloaded checkpoints reach 64K for the Qwen3-30B-A3B shape and
// 128K for DeepSeek-V2-Lite's, and the planner says what lengthens a run that lacks them.
TEST(SequenceFit, OffloadReachesTheIssueTargetsAndIsAdvised) {
  const Hardware hw = h200Capped24();
  // Planned at 2K: every layer on the GPU (at 64K the planner would move layers to the CPU).
  PlanRequest qwen = request("qwen3-30b-a3b.json", 2048);
  const SequenceFit plain = longestSequenceThatFits(qwen, hw, planMemory(qwen, hw));
  EXPECT_LT(plain.longest_cutoff_len, 65536);
  ASSERT_FALSE(plain.lengthen.empty());
  EXPECT_NE(plain.lengthen.front().find("offload_checkpoints: true"), std::string::npos)
      << plain.lengthen.front();
  qwen.offload_checkpoints = true;
  EXPECT_GE(longestSequenceThatFits(qwen, hw, planMemory(qwen, hw)).longest_cutoff_len, 65536);
  PlanRequest lite = request("deepseek-v2-lite.json", 131072);
  lite.offload_checkpoints = true;
  const MemoryPlan plan = planMemory(lite, hw);
  const SequenceFit fit = longestSequenceThatFits(lite, hw, plan);
  EXPECT_GE(fit.longest_cutoff_len, 131072) << sequenceFitLine(fit);
  EXPECT_EQ(fit.gpu_peak_bytes, gpuBytes(plan));
  EXPECT_NE(sequenceFitLine(fit).find("cutoff_len 131072: GPU peak "), std::string::npos)
      << sequenceFitLine(fit);
}

TEST(SequenceFit, AMachineWithoutRoomSaysNone) {
  Hardware hw = h200Capped24();
  for (NumaNodeSpec& node : hw.numa_nodes) node.free_bytes = kGiB;  // less than the experts
  const PlanRequest r = request("qwen3-30b-a3b.json", 2048);
  const MemoryPlan plan = planMemory(r, hw);
  const SequenceFit fit = longestSequenceThatFits(r, hw, plan, /*advise=*/false);
  EXPECT_EQ(fit.longest_cutoff_len, 0);
  EXPECT_NE(sequenceFitLine(fit).find("none (not even 256 tokens)"), std::string::npos)
      << sequenceFitLine(fit);
}

}  // namespace
}  // namespace tandem::placement
