// Issue 29's long-sequence machinery on a whole model: offloaded checkpoints (gpu/
// checkpoint_offload.h) and the MoE block in token chunks (MoeBlock::token_chunk) give the loss and
// every LoRA gradient of the plain run.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/io/lora_target.h"
#include "engine/model/causal_lm.h"
#include "engine/model/lora_gradients_test_util.h"
#include "engine/model/moe_block.h"
#include "engine/model/tiny_moe_test_util.h"

namespace tandem::model {
namespace {

struct Settings {
  bool checkpointing = true;
  bool offload = false;
  int64_t moe_token_chunk = 0;
  bool keep_expert_forward = false;
  int64_t gpu_experts = 0;
};

struct Step {
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;  // every LoRA gradient, torch side and experts
  uint64_t host_activation_peak = 0;                // MemoryLedger ("cpu", Activations)
  std::vector<std::set<int64_t>> chunk_experts;     // per router call, the experts it chose
};

// One step of a two-layer Qwen3-MoE (8 experts, top 2) over [2, 50] tokens.
Step trainStep(const Settings& s) {
  const io::ModelConfig config = testing::tinyQwen3MoeConfig(8);
  ModelOptions options;
  options.gradient_checkpointing = s.checkpointing;
  options.offload_checkpoints = s.offload;
  options.moe_token_chunk = s.moe_token_chunk;
  options.keep_expert_forward = s.keep_expert_forward;
  options.gpu_experts.assign(2, s.gpu_experts);
  const LoraPlan plan =
      loraPlanFromTarget(io::LoraTarget::parse("all"), gpu::LoraSettings{4, 8.0, false, 0.0});
  auto model = CausalLm::random(config, options, &plan, /*seed=*/7, ThreadPool::global());
  Step step;
  // B ≠ 0 everywhere (PEFT starts it at 0): the A gradients are then not 0 either.
  at::manual_seed(1);
  model->visitLinears([](const std::string&, gpu::LoraLinear& l) {
    if (l.hasLora()) l.loraB().detach().uniform_(-0.05, 0.05);
  });
  model->visitMoeBlocks([&](const std::string&, MoeBlock& block) {
    for (auto proj :
         {experts::ExpertProj::Gate, experts::ExpertProj::Up, experts::ExpertProj::Down}) {
      for (float& b : block.experts->lora().allB(proj)) b = 0.01f;  // B ≠ 0: expert LoRA matters
    }
    block.route_observer = [&step](const at::Tensor& ids) {
      const at::Tensor c = ids.to(at::kCPU, at::kLong).contiguous();
      step.chunk_experts.emplace_back(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    };
  });
  at::manual_seed(3);
  const at::Tensor ids = at::randint(config.vocab_size, {2, 50}, at::kLong);
  MemoryLedger::global().resetPeaks();
  const at::Tensor loss = model->loss(model->forwardHidden(ids, /*training=*/true), ids);
  loss.backward();
  step.loss = loss.item<float>();
  step.host_activation_peak = MemoryLedger::global().usage("cpu").peak(MemoryCategory::Activations);
  step.grads = testing::loraGradients(*model);
  return step;
}

// |a - b| <= 1e-5 · max|b| + 1e-7 element-wise over each gradient (fp32, the summation order of
// the experts' per-token sums may differ by chunk).
void expectSameGradients(const Step& expected, const Step& actual) {
  EXPECT_NEAR(actual.loss, expected.loss, 1e-6 * std::abs(expected.loss));
  ASSERT_EQ(expected.grads.size(), actual.grads.size());
  for (const auto& [name, want] : expected.grads) {
    ASSERT_TRUE(actual.grads.count(name)) << name;
    const std::vector<float>& got = actual.grads.at(name);
    ASSERT_EQ(want.size(), got.size()) << name;
    float scale = 0;
    for (float w : want) scale = std::max(scale, std::abs(w));
    ASSERT_GT(scale, 0.0f) << name << ": a gradient that is all zero tests nothing";
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5 * scale + 1e-7) << name << "[" << i << "]";
    }
  }
}

TEST(OffloadCheckpoints, SameLossAndGradientsAsCheckpointsOnTheDevice) {
  const Step resident = trainStep({});
  const Step offloaded = trainStep({.offload = true});
  // The copies are bitwise, so is everything computed from them.
  EXPECT_EQ(offloaded.loss, resident.loss);
  EXPECT_EQ(offloaded.grads, resident.grads);
  expectSameGradients(resident, offloaded);  // and none of them is all zero
  // Two layers' inputs [2, 50, 32] fp32 were in host memory at once.
  EXPECT_GE(offloaded.host_activation_peak, 2u * 2 * 50 * 32 * sizeof(float));
}

TEST(OffloadCheckpoints, ImplyCheckpointing) {
  // Offload without gradient_checkpointing: checkpoints are taken (and offloaded) anyway.
  const Step offloaded = trainStep({.checkpointing = false, .offload = true});
  expectSameGradients(trainStep({}), offloaded);
  EXPECT_GE(offloaded.host_activation_peak, 2u * 2 * 50 * 32 * sizeof(float));
}

TEST(MoeTokenChunk, ChunksThatDoNotDivideTheTokensGiveTheWholeBlocksResults) {
  const Step whole = trainStep({});
  // 100 tokens in chunks of 7: 14 of 7 and one of 2, per MoE layer, recomputation included.
  const Step chunked = trainStep({.moe_token_chunk = 7});
  expectSameGradients(whole, chunked);
  // Forward and recomputation of two layers, each 15 router calls.
  EXPECT_EQ(chunked.chunk_experts.size(), 4u * 15);
  EXPECT_EQ(whole.chunk_experts.size(), 4u);
}

TEST(MoeTokenChunk, AChunkThatReachesFewExpertsIsFine) {
  // Chunks of 3 tokens reach at most 6 of the 8 experts: most experts get nothing in a chunk.
  const Step whole = trainStep({});
  const Step chunked = trainStep({.moe_token_chunk = 3});
  const bool some_expert_idle =
      std::any_of(chunked.chunk_experts.begin(), chunked.chunk_experts.end(),
                  [](const std::set<int64_t>& e) { return e.size() < 8; });
  EXPECT_TRUE(some_expert_idle);
  expectSameGradients(whole, chunked);
}

TEST(MoeTokenChunk, WithKeptExpertForwardAndResidentExperts) {
  // Each chunk keeps its own CPU expert forward for its recomputation; resident experts are
  // chosen at the first chunk and computed per chunk beside the CPU engine.
  const Step whole = trainStep({.keep_expert_forward = true, .gpu_experts = 2});
  const Step chunked = trainStep(
      {.offload = true, .moe_token_chunk = 9, .keep_expert_forward = true, .gpu_experts = 2});
  expectSameGradients(whole, chunked);
}

TEST(MoeTokenChunk, WithoutCheckpointing) {
  expectSameGradients(trainStep({.checkpointing = false}),
                      trainStep({.checkpointing = false, .moe_token_chunk = 16}));
}

}  // namespace
}  // namespace tandem::model
