// Host memory of a random model in cpu and auto modes (issue 28, the 48-layer Qwen3 on the 128 GB
// H200 machine): the loader's invented experts are freed once the CPU engine packed every expert
// into memory of its own (and auto made its host copy), with the same numbers as keeping them;
// auto's host copy is one block per layer, of the bytes the planner charges for it.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/host_block.h"
#include "engine/io/lora_target.h"
#include "engine/io/model_config.h"
#include "engine/model/causal_lm.h"
#include "engine/model/lora_gradients_test_util.h"
#include "engine/model/moe_block.h"
#include "engine/model/stored_expert_weights.h"
#include "engine/model/tiny_moe_test_util.h"
#include "engine/placement/memory_model.h"

namespace tandem::model {
namespace {

struct Built {
  std::unique_ptr<CausalLm> model;
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> grads;  // after both passes
};

ModelOptions tinyOptions(ExpertsMode mode, const std::string& format, int64_t gpu_experts = 0) {
  ModelOptions options;  // fp32 on the CPU device
  options.experts = mode;
  options.experts_backend = "generic";
  options.experts_format = format;
  options.gpu_experts.assign(2, gpu_experts);
  if (mode == ExpertsMode::Auto) {
    options.expert_split = ExpertSplitChoice::Cycle;  // every path, on the CPU device too
    options.gpu_experts.assign(2, 2);
  }
  return options;
}

Built buildAndTrain(const ModelOptions& options) {
  const io::ModelConfig config = testing::tinyQwen2MoeConfig();
  const LoraPlan plan =
      loraPlanFromTarget(io::LoraTarget::parse("all"), gpu::LoraSettings{4, 8.0, false, 0.0});
  Built b;
  b.model = CausalLm::random(config, options, &plan, /*seed=*/3, ThreadPool::global());
  for (int p = 0; p < 2; ++p) {
    const at::Tensor ids =
        (at::arange(24, at::kLong) * (p + 1) + p).remainder(config.vocab_size).view({2, 12});
    const at::Tensor loss = b.model->loss(b.model->forwardHidden(ids, /*training=*/true), ids);
    loss.backward();
    b.losses.push_back(loss.item<float>());
  }
  b.grads = testing::loraGradients(*b.model);
  return b;
}

bool writes(const CausalLm& model) {
  try {
    model.writeRandomWeights(std::filesystem::path(::testing::TempDir()) / "random.safetensors");
    return true;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("keep_random_experts"), std::string::npos) << e.what();
    return false;
  }
}

// int8 packs (generic backend, persistent Wᵀ) hold their own bytes: the invented fp32 experts are
// freed (the write is refused, saying what keeps them), and training gives bitwise the numbers of
// a model that kept them. cpu mode with 2 resident experts frees them after its first call (which
// copies the resident ones from them): a write before it still works.
TEST(RandomExpertsMemory, CpuAndAutoModesFreeTheInventedExpertsOnceTheEngineOwnsItsPacks) {
  for (const auto& [mode, resident] :
       {std::pair{ExpertsMode::Cpu, 0}, std::pair{ExpertsMode::Auto, 0},
        std::pair{ExpertsMode::Cpu, 2}}) {
    SCOPED_TRACE(std::string(mode == ExpertsMode::Cpu ? "cpu" : "auto") + ", resident " +
                 std::to_string(resident));
    ModelOptions keep = tinyOptions(mode, "int8", resident);
    keep.keep_random_experts = true;
    const Built kept = buildAndTrain(keep);
    const Built freed = buildAndTrain(tinyOptions(mode, "int8", resident));
    if (resident > 0) {
      const io::ModelConfig config = testing::tinyQwen2MoeConfig();
      auto before_first_call = CausalLm::random(config, tinyOptions(mode, "int8", resident),
                                                nullptr, /*seed=*/3, ThreadPool::global());
      EXPECT_TRUE(writes(*before_first_call));
    }
    EXPECT_TRUE(writes(*kept.model));
    EXPECT_FALSE(writes(*freed.model));
    EXPECT_EQ(freed.losses, kept.losses);
    ASSERT_EQ(freed.grads.size(), kept.grads.size());
    for (const auto& [name, want] : kept.grads) EXPECT_EQ(freed.grads.at(name), want) << name;
    bool engine_owns = false;
    freed.model->visitMoeBlocks([&](const std::string&, MoeBlock& block) {
      engine_owns = !block.experts->readsWeightViews() && block.experts->packedBytes() > 0;
    });
    EXPECT_TRUE(engine_owns);
  }
}

// Where the engine still reads the views, they stay: fp32 weights in the bf16 format are read
// zero-copy by the generic backend; a Wᵀ built per backward (on_demand) reads them every step.
TEST(RandomExpertsMemory, TheViewsTheEngineStillReadsAreKept) {
  const Built zero_copy = buildAndTrain(tinyOptions(ExpertsMode::Cpu, "bf16"));
  EXPECT_TRUE(writes(*zero_copy.model));
  ModelOptions on_demand = tinyOptions(ExpertsMode::Cpu, "int8");
  on_demand.experts_wt_policy = experts::WtPolicy::OnDemand;
  const Built per_backward = buildAndTrain(on_demand);
  EXPECT_TRUE(writes(*per_backward.model));
  per_backward.model->visitMoeBlocks(
      [&](const std::string&, MoeBlock& block) { EXPECT_TRUE(block.experts->readsWeightViews()); });
}

// A host block's tensors: the shapes asked, one storage, each from a multiple of 256 bytes, the
// block exactly their aligned bytes.
TEST(RandomExpertsMemory, AHostBlockCarvesAlignedTensorsOutOfOneAllocation) {
  const std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> shapes{
      {{3, 5, 7}, at::kChar}, {{3, 5}, at::kFloat}, {{2, 9}, at::kBFloat16}, {{0, 4}, at::kFloat}};
  const std::vector<at::Tensor> t = gpu::carveHostBlock(shapes, /*pinned=*/false);
  ASSERT_EQ(t.size(), shapes.size());
  EXPECT_EQ(gpu::hostBlockBytes(shapes), 256 + 256 + 256 + 0);
  const auto* base = static_cast<const char*>(t[0].data_ptr());
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].sizes().vec(), shapes[i].first);
    EXPECT_EQ(t[i].scalar_type(), shapes[i].second);
    EXPECT_TRUE(t[i].is_contiguous());
    if (t[i].numel() == 0) continue;
    EXPECT_TRUE(t[i].storage().is_alias_of(t[0].storage()));
    EXPECT_EQ((static_cast<const char*>(t[i].data_ptr()) - base) % gpu::kHostBlockAlignment, 0);
  }
  // Writing one leaves the others as they were.
  t[1].fill_(2.5f);
  t[0].fill_(-1);
  t[2].fill_(1.0f);
  EXPECT_EQ(t[1].sum().item<float>(), 2.5f * 15);
}

// The planner's host copy of a layer (placement::memory::splitHostCopyBytes) is what the runtime
// allocates for it: Qwen3-30B-A3B's int8, and a shape whose tensors need padding.
TEST(RandomExpertsMemory, ThePlannersHostCopyIsTheBlockTheRuntimeAllocates) {
  io::ModelConfig qwen3 = testing::tinyQwen2MoeConfig();
  for (const auto& [E, H, I] : {std::tuple{128, 2048, 768}, std::tuple{6, 48, 24}}) {
    qwen3.num_experts = E;
    qwen3.hidden_size = H;
    qwen3.moe_intermediate_size = I;
    qwen3.intermediate_size = I;
    EXPECT_EQ(placement::memory::splitHostCopyBytes(qwen3, "int8", true),
              static_cast<uint64_t>(gpu::hostBlockBytes(StoredExpertWeights::int8Shapes(E, H, I))))
        << E << " experts, H " << H << ", I " << I;
  }
}

}  // namespace
}  // namespace tandem::model
