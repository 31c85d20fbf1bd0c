#include "engine/model/moe_function.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_routing.h"
#include "engine/io/lora_target.h"
#include "engine/io/model_config.h"
#include "engine/model/causal_lm.h"
#include "engine/model/lora_gradients_test_util.h"
#include "engine/model/moe_block.h"
#include "engine/model/tiny_moe_test_util.h"

namespace tandem::model {
namespace {

struct Step {
  std::map<std::string, std::vector<float>> grads;  // every LoRA gradient, torch side and experts
  uint64_t expert_cache_peak = 0;                   // MemoryLedger ("cpu", Activations)
  int64_t reused = 0;                               // recomputations that reused a kept forward
  float loss = 0;
  std::vector<std::vector<int64_t>> resident;  // per MoE layer, the resident experts
  int64_t streamed_experts = 0;     // offload mode: experts streamed per call, all layers
  ExpertStreamer::Counts streamer;  // offload mode: its device's streamer
};

using testing::tensorValues;

Step trainStep(bool keep, int64_t gpu_experts = 0, bool checkpointing = true,
               const std::string& experts_format = "auto", ExpertsMode experts = ExpertsMode::Cpu,
               const std::string& experts_backend = "auto",
               placement::Device device = placement::Device::cpu(), bool stream_ahead = true) {
  const io::ModelConfig config = testing::tinyQwen2MoeConfig();
  ModelOptions options;
  options.device = device;
  options.experts = experts;
  options.experts_format = experts_format;
  options.experts_backend = experts_backend;
  options.gradient_checkpointing = checkpointing;
  options.keep_expert_forward = keep;
  options.gpu_experts.assign(2, gpu_experts);
  options.stream_experts_ahead = stream_ahead;
  const LoraPlan plan =
      loraPlanFromTarget(io::LoraTarget::parse("all"), gpu::LoraSettings{4, 8.0, false, 0.0});
  auto model = CausalLm::random(config, options, &plan, /*seed=*/3, ThreadPool::global());
  model->visitMoeBlocks([](const std::string&, MoeBlock& block) {  // B ≠ 0: expert LoRA matters
    for (auto proj :
         {experts::ExpertProj::Gate, experts::ExpertProj::Up, experts::ExpertProj::Down}) {
      for (float& b : block.experts->lora().allB(proj)) b = 0.01f;
    }
  });
  const at::Tensor ids = at::arange(20, at::kLong).remainder(config.vocab_size).view({2, 10});
  const int64_t reused_before = reusedExpertForwards();
  MemoryLedger::global().resetPeaks();
  const at::Tensor loss = model->loss(model->forwardHidden(ids, /*training=*/true), ids);
  loss.backward();
  Step step;
  step.loss = loss.item<float>();
  step.reused = reusedExpertForwards() - reused_before;
  for (const DeviceMemoryUsage& usage : MemoryLedger::global().snapshot()) {
    if (usage.device == "cpu") step.expert_cache_peak = usage.peak(MemoryCategory::Activations);
  }
  step.grads = testing::loraGradients(*model);
  model->visitMoeBlocks([&](const std::string&, MoeBlock& block) {
    if (block.resident) step.resident.push_back(block.resident->experts());
    if (block.offload) {
      step.streamed_experts += block.offload->streamedExperts();
      step.streamer = block.offload->streamer().counts();
      if (block.resident_count > 0) step.resident.push_back(block.offload->residentExperts());
    }
  });
  return step;
}

// The recomputation reuses the kept expert forward (one per MoE layer) and the gradients are
// bitwise the ones of recomputing the experts; the price is every layer's cache held at once.
TEST(KeptExpertForward, SameGradientsWithoutRecomputingTheExperts) {
  const Step recomputed = trainStep(false);
  const Step kept = trainStep(true);
  EXPECT_EQ(recomputed.reused, 0);
  EXPECT_EQ(kept.reused, 2);
  ASSERT_EQ(recomputed.grads.size(), kept.grads.size());
  for (const auto& [name, grad] : recomputed.grads) {
    ASSERT_TRUE(kept.grads.count(name)) << name;
    EXPECT_EQ(grad, kept.grads.at(name)) << name;
    // PEFT's B = 0 makes the torch side's grad A zero; every other gradient must carry signal.
    if (name.ends_with(".A") && name.find(".experts.") == std::string::npos) continue;
    bool nonzero = false;
    for (float g : grad) nonzero = nonzero || g != 0.0f;
    EXPECT_TRUE(nonzero) << name << ": a gradient that is all zeros tests nothing";
  }
  EXPECT_GT(kept.expert_cache_peak, recomputed.expert_cache_peak);
}

// The checkpointed pass's kept forward is reused only when the recomputation's hidden states
// and routing are bitwise the kept ones (the cache compares its own copy of x); any other input
// runs the experts again, with the numbers of a forward that never kept anything.
TEST(KeptExpertForward, ReusedOnlyForTheSameInputs) {
  constexpr int64_t E = 4, H = 8, I = 6, T = 5;
  at::manual_seed(11);
  const at::Tensor gate = at::randn({E, I, H}), up = at::randn({E, I, H}),
                   down = at::randn({E, H, I});
  experts::ExpertWeightViews views;
  views.type = experts::WeightType::F32;
  for (int64_t e = 0; e < E; ++e) {
    views.gate.push_back(gate[e].data_ptr<float>());
    views.up.push_back(up[e].data_ptr<float>());
    views.down.push_back(down[e].data_ptr<float>());
  }
  auto layer = experts::ExpertLayer::create({E, H, I}, views, {}, "generic", ThreadPool::global());
  const at::Tensor ids =
      at::tensor(std::vector<int64_t>{0, 1, 2, 3, 1, 2, 3, 0, 2, 1}, at::kLong).view({T, 2});
  const at::Tensor weights = at::full({T, 2}, 0.5f);
  const at::Tensor kept_x = at::randn({T, H});
  auto recomputed = [&](const at::Tensor& x, KeptExpertForward* keep) {
    const at::Tensor hidden = x.clone().requires_grad_(true);
    const at::Tensor y = routedExperts(*layer, hidden, ids, weights, at::Tensor(), {}, keep);
    y.sum().backward();
    return std::make_pair(tensorValues(y), tensorValues(hidden.grad()));
  };
  for (const bool same : {false, true}) {
    SCOPED_TRACE(same ? "same inputs" : "other hidden states");
    KeptExpertForward keep;
    const uint64_t held_before =
        MemoryLedger::global().usage("cpu").current(MemoryCategory::Activations);
    {
      at::NoGradGuard no_grad;  // the checkpointed pass
      routedExperts(*layer, kept_x, ids, weights, at::Tensor(), {}, &keep);
    }
    // What is kept is charged: the cache (x among it) and the output, nothing twice.
    ASSERT_TRUE(keep.cache);
    EXPECT_EQ(
        MemoryLedger::global().usage("cpu").current(MemoryCategory::Activations) - held_before,
        keep.cache->bytes() + static_cast<uint64_t>(T * H) * sizeof(float));
    const at::Tensor x = same ? kept_x : kept_x + 0.25f;
    const int64_t before = reusedExpertForwards();
    const auto got = recomputed(x, &keep);
    EXPECT_EQ(reusedExpertForwards() - before, same ? 1 : 0);
    EXPECT_EQ(got, recomputed(x, nullptr));
  }
}

// Resident experts (torch ops on the layer's device, here the CPU device) computing some pairs
// and the CPU engine the rest give the all-engine numbers: the loss and every gradient, the
// resident experts' LoRA grads included (a pair lost or counted twice would be off by its whole
// contribution). Also with checkpointing (the recomputation keeps the resident part's graph for
// its backward), with the kept forward too (the CPU part reused), with 5 of 6 resident (most tokens
// then have no CPU pair and stay on the device: CpuTokens), and with every expert resident (the CPU
// engine is not called at all).
TEST(ResidentExperts, SameNumbersAsTheCpuEngine) {
  const Step engine = trainStep(false, 0, /*checkpointing=*/false);
  struct Case {
    bool keep;
    int64_t gpu_experts;
    bool checkpointing;
    int64_t reused;  // kept CPU forwards the recomputation reuses: none when the CPU has no pair
  };
  for (const Case c : {Case{false, 2, false, 0}, Case{false, 2, true, 0}, Case{true, 2, true, 2},
                       Case{false, 5, false, 0}, Case{true, 5, true, 2}, Case{false, 6, true, 0},
                       Case{true, 6, true, 0}}) {
    SCOPED_TRACE("keep " + std::to_string(c.keep) + ", gpu_experts " +
                 std::to_string(c.gpu_experts));
    const Step split = trainStep(c.keep, c.gpu_experts, c.checkpointing);
    ASSERT_EQ(split.resident.size(), 2u);
    for (const auto& experts : split.resident)
      EXPECT_EQ(static_cast<int64_t>(experts.size()), c.gpu_experts);
    EXPECT_EQ(split.reused, c.reused);
    EXPECT_NEAR(split.loss, engine.loss, 1e-5f * std::abs(engine.loss));
    ASSERT_EQ(split.grads.size(), engine.grads.size());
    for (const auto& [name, want] : engine.grads) {
      const std::vector<float>& got = split.grads.at(name);
      ASSERT_EQ(got.size(), want.size()) << name;
      float scale = 0, worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::abs(want[i]));
        worst = std::max(worst, std::abs(got[i] - want[i]));
      }
      EXPECT_LE(worst, 1e-4f * scale + 1e-9f) << name;
    }
  }
}

float worstRelativeError(const Step& got, const Step& want) {
  return testing::worstRelativeError(got.loss, got.grads, want.loss, want.grads);
}

// experts_format int8: the resident experts and offload mode's streamed copies are the CPU
// engine's int8 weights (same quantisation, dequantised on the device), so both give the
// all-engine int8 loss and gradients, which differ from the unquantised ones by far more: a path
// that kept its experts unquantised, or quantised them otherwise, would fail. The engine runs
// `generic`, which multiplies the int8 weights with unrounded activations as the devices do
// (`auto` is amx_int8 on an AMX host, which rounds the activations to int8 too).
TEST(StoredExpertWeights, Int8ExpertsOnTheDeviceMultiplyTheEnginesInt8Weights) {
  auto step = [](bool keep, int64_t gpu_experts, bool checkpointing, const std::string& format,
                 ExpertsMode experts = ExpertsMode::Cpu) {
    return trainStep(keep, gpu_experts, checkpointing, format, experts, "generic");
  };
  const Step engine = step(false, 0, false, "int8");
  EXPECT_GT(worstRelativeError(step(false, 0, false, "bf16"), engine), 1e-3f);
  EXPECT_LE(worstRelativeError(step(false, 2, false, "int8"), engine), 1e-4f) << "2 resident";
  EXPECT_LE(worstRelativeError(step(true, 6, true, "int8"), engine), 1e-4f)
      << "all resident, kept forward";
  EXPECT_LE(worstRelativeError(step(false, 0, true, "int8", ExpertsMode::GpuOffload), engine),
            1e-4f)
      << "offload";
  EXPECT_LE(worstRelativeError(step(false, 2, true, "int8", ExpertsMode::GpuOffload), engine),
            1e-4f)
      << "offload with 2 resident";
}

// Offload mode with a resident cache (gpu_experts): the resident experts stay on the device, only
// the others are streamed, and the numbers are those of streaming every expert: with and without
// checkpointing, with some, most or all of them resident. On a GPU (the device run of this test
// binary) the copies run on a side stream. The streamer's look-ahead changes no number; without a
// cache it copies layer 1's experts while layer 0 computes (with one, layer 1 chooses its cache
// only when it runs, so a first step copies nothing ahead; expert_streamer_test.cpp has the longer
// sequences).
TEST(ExpertOffload, AResidentCacheGivesTheNumbersOfStreamingEveryExpert) {
  std::vector<placement::Device> devices{placement::Device::cpu()};
  if (at::hasCUDA()) devices.push_back(placement::Device::cuda(0));
  for (const placement::Device device : devices) {
    auto offload = [&](int64_t gpu_experts, bool checkpointing, bool ahead = true) {
      return trainStep(false, gpu_experts, checkpointing, "auto", ExpertsMode::GpuOffload, "auto",
                       device, ahead);
    };
    const Step streamed = offload(0, false);
    EXPECT_TRUE(streamed.resident.empty());
    EXPECT_EQ(streamed.streamed_experts, 2 * 6);
    EXPECT_EQ(streamed.streamer.taken, 4);  // forward 0, 1; backward 1, 0
    EXPECT_EQ(streamed.streamer.ready, 3);
    EXPECT_EQ(streamed.streamer.copied_ahead, 1);
    for (const auto& [gpu_experts, checkpointing] :
         {std::pair{2, false}, {2, true}, {5, true}, {6, false}}) {
      SCOPED_TRACE(device.str() + ", gpu_experts " + std::to_string(gpu_experts) +
                   ", checkpointing " + std::to_string(checkpointing));
      const Step cached = offload(gpu_experts, checkpointing);
      ASSERT_EQ(cached.resident.size(), 2u);
      for (const auto& experts : cached.resident)
        EXPECT_EQ(static_cast<int64_t>(experts.size()), gpu_experts);
      EXPECT_EQ(cached.streamed_experts, 2 * (6 - gpu_experts));
      EXPECT_LE(worstRelativeError(cached, streamed), 1e-5f);
      const Step serial = offload(gpu_experts, checkpointing, /*ahead=*/false);
      EXPECT_EQ(worstRelativeError(serial, cached), 0.0f);
      EXPECT_EQ(serial.streamer.copied_ahead, 0);
    }
  }
}

// Only the tokens with a pair for the CPU engine cross to the host; the engine's rows go back to
// their tokens, added onto the device part where there is one.
TEST(CpuTokens, OnlyTheTokensWithACpuPairCrossToTheHost) {
  constexpr int32_t m = experts::kMaskedSlot;
  const at::Tensor ids =
      at::tensor(std::vector<int32_t>{m, m, 3, m, m, m, m, 5}, at::kInt).view({4, 2});
  const CpuTokens tokens = CpuTokens::of(ids, at::kCPU);
  ASSERT_TRUE(tokens.rows.defined());
  EXPECT_EQ(tensorValues(tokens.rows), (std::vector<float>{1, 3}));
  const at::Tensor hidden = at::arange(12, at::kFloat).view({4, 3});
  EXPECT_EQ(tensorValues(tokens.gather(hidden)), (std::vector<float>{3, 4, 5, 9, 10, 11}));
  const at::Tensor part = at::full({2, 3}, 2.0f);
  EXPECT_EQ(tensorValues(tokens.scatter(part, 4, at::Tensor())),
            (std::vector<float>{0, 0, 0, 2, 2, 2, 0, 0, 0, 2, 2, 2}));
  EXPECT_EQ(tensorValues(tokens.scatter(part, 4, at::ones({4, 3}))),
            (std::vector<float>{1, 1, 1, 3, 3, 3, 1, 1, 1, 3, 3, 3}));
  // Every token has a CPU pair, or none has: nothing to select, the tensors pass through.
  const CpuTokens all =
      CpuTokens::of(at::tensor(std::vector<int32_t>{0, m, m, 1}, at::kInt).view({2, 2}), at::kCPU);
  EXPECT_FALSE(all.rows.defined());
  EXPECT_TRUE(all.gather(hidden).is_same(hidden));
  EXPECT_FALSE(CpuTokens::of(at::full({2, 2}, m, at::kInt), at::kCPU).rows.defined());
}

// The resident experts are the most routed of the first call, ties to the lower id.
TEST(ResidentExperts, MostRoutedOfTheFirstCall) {
  const at::Tensor ids =
      at::tensor(std::vector<int64_t>{3, 1, 3, 0, 5, 3, 1, 5}, at::kLong).view({4, 2});
  EXPECT_EQ(ResidentExperts::mostRouted(ids, 6, 2), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(ResidentExperts::mostRouted(ids, 6, 3), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(ResidentExperts::mostRouted(ids, 6, 4), (std::vector<int64_t>{0, 1, 3, 5}));
  EXPECT_EQ(ResidentExperts::mostRouted(ids, 6, 9).size(), 6u);
}

// With resident experts the CPU engine packs nothing at load and, at the first call, only the
// experts it computes: the host never holds the packs of the resident ones (int8: real packs, not
// zero-copy views of the weights).
TEST(ResidentExperts, OnlyTheCpuExpertsArePacked) {
  const io::ModelConfig config = testing::tinyQwen2MoeConfig();
  auto packed = [&](int64_t gpu_experts, bool run) {
    ModelOptions options;
    options.experts_format = "int8";
    options.gpu_experts.assign(2, gpu_experts);
    auto model = CausalLm::random(config, options, nullptr, /*seed=*/3, ThreadPool::global());
    if (run) {
      at::NoGradGuard no_grad;
      model->forwardHidden(at::arange(20, at::kLong).remainder(config.vocab_size).view({2, 10}),
                           false);
    }
    uint64_t bytes = 0;
    model->visitMoeBlocks(
        [&](const std::string&, MoeBlock& block) { bytes += block.experts->packedBytes(); });
    return bytes;
  };
  const uint64_t all = packed(0, false);
  ASSERT_GT(all, 0u);
  EXPECT_EQ(packed(2, false), 0u);
  EXPECT_EQ(packed(2, true), all / config.num_experts * (config.num_experts - 2));
  EXPECT_EQ(packed(config.num_experts, true), 0u);
}

}  // namespace
}  // namespace tandem::model
