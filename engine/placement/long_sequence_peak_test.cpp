// The planner's GPU figure against the caching allocator's measured peaks (issue 29: "within 15 %
// of the allocator's peak at 16K and 64K", never below it) and its longest sequence that fits
// against the longest that ran ("within one power of two").
//
// The measured bytes are the H200 runs of branch lc3 at eb5b990 merged with auto2, amx4 and gpu4
// (scratch branch, 2026-12-03 15:27; /work/briefs/v2_long.json and q3_long.json, summarised in
// docs/benchmarks.md "Long sequences on the H200, offload mode in token chunks"): full depth,
// random weights of the published configs (the presets here are the same), bf16, LoRA r=8 on
// attention, int8 experts streamed in offload mode (--gpu-experts 0), offloaded checkpoints,
// moe_token_chunk auto, libtorch's allocator capped at 24 GiB. Each length's peak is
// torch's allocated_bytes peak on cuda:0 (gpu::gpuMemoryPeak), reset per length.

#include <gtest/gtest.h>

#include "engine/placement/sequence_fit.h"

namespace tandem::placement {
namespace {

namespace fs = std::filesystem;
const fs::path kPresets = fs::path(TANDEM_PRESETS_DIR);
constexpr uint64_t kGiB = uint64_t{1} << 30;

// The e2e bench's run: tandem_e2e_bench --experts gpu-offload --gpu-experts 0 --experts-format
// int8 --offload-checkpoints --lora-rank 8 --lora-target ATTENTION (model::planRequestFor).
PlanRequest benchRun(const char* model_file, std::vector<std::string> attention, int64_t tokens) {
  PlanRequest r;
  r.model = io::readModelConfig(kPresets / "models" / model_file);
  r.cutoff_len = tokens;
  r.lora_rank = 8;
  r.lora_target = std::move(attention);
  r.experts_backend = "gpu-offload";
  r.expert_weight_format = "int8";
  r.gpu_experts = 0;
  r.offload_checkpoints = true;
  r.gradient_checkpointing = true;
  return r;
}

PlanRequest liteRun(int64_t tokens) {
  return benchRun("deepseek-v2-lite.json", {"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"},
                  tokens);
}
PlanRequest qwenRun(int64_t tokens) {
  return benchRun("qwen3-30b-a3b.json", {"q_proj", "k_proj", "v_proj", "o_proj"}, tokens);
}

// The team's H200 machine with its GPU capped at 24 GiB, as the bench plans it.
Hardware h200Capped24() {
  Hardware hw = resolveHardware("1xh200_xeon-16c_128g", kPresets / "hardware");
  hw.gpus.at(0).free_bytes = 24 * kGiB;
  return hw;
}

struct Measured {
  const char* shape;
  int64_t tokens;
  uint64_t peak_allocated_bytes;  // sequence.peak_allocated_bytes of the run's JSON
};

// Before this change the planner said 1.18 / 1.19 (V2-Lite) and 1.13 / 1.22 (Qwen3) of these.
constexpr Measured kH200Peaks[] = {
    {"deepseek-v2-lite", 16384, 8861403136},    // 8.25 GiB (reserved 9.77)
    {"deepseek-v2-lite", 65536, 14143411200},   // 13.17 GiB (reserved 17.65)
    {"qwen3-30b-a3b-48l", 16384, 10270137344},  // 9.56 GiB (reserved 11.12)
    {"qwen3-30b-a3b-48l", 65536, 16599148544},  // 15.46 GiB (reserved 20.25)
};

TEST(LongSequencePeak, AllocatedPeakWithin15PercentAboveTheH200Runs) {
  const Hardware hw = h200Capped24();
  for (const Measured& run : kH200Peaks) {
    const bool lite = std::string(run.shape) == "deepseek-v2-lite";
    const PlanRequest r = lite ? liteRun(run.tokens) : qwenRun(run.tokens);
    const MemoryPlan plan = planMemory(r, hw);
    const DevicePlan* gpu = plan.device(Device::cuda(0));
    ASSERT_NE(gpu, nullptr);
    // Every decoder layer on the GPU, as the run placed them.
    for (const Device d : plan.placement.layerDevices()) EXPECT_EQ(d, Device::cuda(0)) << run.shape;
    const double ratio =
        static_cast<double>(gpu->allocatedPeak()) / static_cast<double>(run.peak_allocated_bytes);
    EXPECT_GE(ratio, 1.0) << run.shape << " " << run.tokens << ": the planner under-predicts";
    EXPECT_LE(ratio, 1.15) << run.shape << " " << run.tokens;
    // What must fit the GPU adds the context and the allocator's cache margin.
    EXPECT_EQ(gpu->total(), gpu->allocatedPeak() + kGpuContextBytes + gpu->allocator_margin_bytes);
    EXPECT_GT(gpu->allocator_margin_bytes, 0u);
  }
}

// The offloaded checkpoints on the GPU: the next layer's input, prefetched. The working layer's
// input is its recomputed norm's saved input (memory::layerActivationBytes), not counted again.
TEST(LongSequencePeak, OnePrefetchedLayerInputBesideTheRecomputedLayer) {
  const PlanRequest r = liteRun(65536);
  const MemoryPlan plan = planMemory(r, h200Capped24());
  uint64_t prefetch = 0;
  for (const PlanItem& i : plan.device(Device::cuda(0))->items)
    prefetch += i.what == "checkpoint prefetch" ? i.bytes : 0;
  EXPECT_EQ(prefetch, uint64_t{65536} * 2048 * 2);
}

// Issue 29: the planner's longest cutoff_len that fits is within one power of two of the longest
// that ran: V2-Lite ran 131,072 tokens and Qwen3 (48 layers) 65,536 at the 24 GiB cap (the
// longest that runs is at least those). The GPU here is 24 GiB with the CUDA context inside it,
// as on a 24 GB card; the bench's cap leaves the context outside (planned with 25 GiB below).
TEST(LongSequencePeak, LongestThatFitsIsWithinAPowerOfTwoOfTheLongestThatRan) {
  for (const uint64_t capacity : {24 * kGiB, 25 * kGiB}) {
    Hardware hw = h200Capped24();
    hw.gpus.at(0).free_bytes = capacity;
    for (const auto& [r, ran] :
         {std::pair{liteRun(2048), int64_t{131072}}, std::pair{qwenRun(2048), int64_t{65536}}}) {
      const SequenceFit fit = longestSequenceThatFits(r, hw, planMemory(r, hw), false);
      EXPECT_GE(2 * fit.longest_cutoff_len, ran)
          << r.model.model_type << " at " << capacity / kGiB << " GiB: " << sequenceFitLine(fit);
      EXPECT_LE(fit.longest_cutoff_len, 2 * ran) << sequenceFitLine(fit);
    }
  }
}

}  // namespace
}  // namespace tandem::placement
