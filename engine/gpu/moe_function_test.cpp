#include "engine/gpu/moe_function.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/core/thread_pool.h"
#include "engine/gpu/causal_lm.h"
#include "engine/gpu/moe_block.h"
#include "engine/io/model_config.h"
#include "engine/model/lora_target.h"

namespace tandem::gpu {
namespace {

// Two MoE layers (one with a shared expert) so a recomputation runs per layer.
constexpr const char* kConfig = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 48,
  "intermediate_size": 64, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 32,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 6,
  "num_experts_per_tok": 2, "norm_topk_prob": false, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "vocab_size": 64, "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "dtype": "float32"})";

struct Step {
  std::map<std::string, std::vector<float>> grads;  // every LoRA gradient, torch side and experts
  uint64_t expert_cache_peak = 0;                   // MemoryLedger ("cpu", Activations)
  int64_t reused = 0;                               // recomputations that reused a kept forward
};

std::vector<float> values(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

Step trainStep(bool keep) {
  const io::ModelConfig config = io::parseModelConfig(kConfig, "test config");
  ModelOptions options;
  options.gradient_checkpointing = true;
  options.keep_expert_forward = keep;
  const LoraPlan plan = loraPlanFromTarget(model::LoraTarget::parse("all"), LoraSettings{4, 8.0, false, 0.0});
  auto model = CausalLm::random(config, options, &plan, /*seed=*/3, ThreadPool::global());
  model->visitMoeBlocks([](const std::string&, MoeBlock& block) {  // B ≠ 0: expert LoRA matters
    for (auto proj : {experts::ExpertProj::Gate, experts::ExpertProj::Up, experts::ExpertProj::Down}) {
      for (float& b : block.experts->lora().allB(proj)) b = 0.01f;
    }
  });
  const at::Tensor ids = at::arange(20, at::kLong).remainder(config.vocab_size).view({2, 10});
  const int64_t reused_before = reusedExpertForwards();
  MemoryLedger::global().resetPeaks();
  model->loss(model->forwardHidden(ids, /*training=*/true), ids).backward();
  Step step;
  step.reused = reusedExpertForwards() - reused_before;
  for (const DeviceMemoryUsage& usage : MemoryLedger::global().snapshot()) {
    if (usage.device == "cpu") step.expert_cache_peak = usage.peak(MemoryCategory::Activations);
  }
  model->visitLinears([&](const std::string& name, LoraLinear& l) {
    if (!l.hasLora()) return;
    step.grads[name + ".A"] = values(l.loraA().grad());
    step.grads[name + ".B"] = values(l.loraB().grad());
  });
  model->visitMoeBlocks([&](const std::string& name, MoeBlock& block) {
    for (auto proj : {experts::ExpertProj::Gate, experts::ExpertProj::Up, experts::ExpertProj::Down}) {
      const std::string p = name + ".experts." + std::to_string(static_cast<int>(proj));
      const auto a = block.experts->lora().allGradA(proj), b = block.experts->lora().allGradB(proj);
      step.grads[p + ".A"] = {a.begin(), a.end()};
      step.grads[p + ".B"] = {b.begin(), b.end()};
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

}  // namespace
}  // namespace tandem::gpu
