#include "engine/model/lora_optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/thread_pool.h"
#include "engine/gpu/lora_linear.h"
#include "engine/io/lora_target.h"
#include "engine/model/causal_lm.h"
#include "engine/model/moe_block.h"
#include "engine/model/tiny_moe_test_util.h"

namespace tandem::model {
namespace {

// Every LoRA weight of the model and where its gradient goes: the torch leaves, or views of the
// expert engine's parameter and gradient buffers.
struct Weight {
  at::Tensor param;
  std::span<float> expert_grad;  // empty: a torch leaf (its .grad())
};

std::vector<Weight> loraWeights(model::CausalLm& model) {
  std::vector<Weight> out;
  model.visitLinears([&](const std::string&, gpu::LoraLinear& l) {
    if (!l.hasLora()) return;
    out.push_back({l.loraA(), {}});
    out.push_back({l.loraB(), {}});
  });
  model.visitMoeBlocks([&](const std::string& mlp, model::MoeBlock& block) {
    // LoRA experts (issue 32): torch leaves like the dense adapters.
    block.lora_experts.visitWeights(mlp, [&](const std::string&, at::Tensor& w) {
      out.push_back({w, {}});
    });
    experts::ExpertLora& lora = block.experts->lora();
    for (auto proj :
         {experts::ExpertProj::Gate, experts::ExpertProj::Up, experts::ExpertProj::Down}) {
      if (!lora.targets(proj)) continue;
      for (auto [param, grad] : {std::pair{lora.allA(proj), lora.allGradA(proj)},
                                 std::pair{lora.allB(proj), lora.allGradB(proj)}}) {
        out.push_back(
            {at::from_blob(param.data(), {static_cast<int64_t>(param.size())}, at::kFloat), grad});
      }
    }
  });
  return out;
}

// Three steps with a learning rate that changes, clipping on, off, on: LoraOptimizer against
// libtorch's torch::optim::AdamW and torch::nn::utils::clip_grad_norm_ (the C++ twins of
// torch.optim.AdamW and torch.nn.utils.clip_grad_norm_, which HF's Trainer runs) on copies of the
// same weights with the same gradients. Every weight and the reported norm must agree.
// With LoRA experts on, their weights are part of the same clip and AdamW.
class LoraOptimizerTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(LoraOptimizerTest, ClipsAndStepsAsTorchsAdamW) {
  const io::ModelConfig config = testing::tinyQwen3MoeConfig(/*num_experts=*/4);
  model::LoraPlan plan = model::loraPlanFromTarget(io::LoraTarget::parse("all"),
                                                   gpu::LoraSettings{4, 8.0, false, 0.0});
  plan.lora_experts = GetParam();
  plan.le_dim = 8;
  auto model = model::CausalLm::random(config, model::ModelOptions{}, &plan, /*seed=*/3,
                                       ThreadPool::global());
  const std::vector<Weight> weights = loraWeights(*model);
  ASSERT_GT(weights.size(), 8u);
  ASSERT_TRUE(std::any_of(weights.begin(), weights.end(),
                          [](const Weight& w) { return !w.expert_grad.empty(); }));

  const AdamWSettings settings{0.9, 0.95, 1e-6, 0.1};
  LoraOptimizer optimizer(*model, settings, ThreadPool::global());
  std::vector<at::Tensor> reference;
  for (const Weight& w : weights)
    reference.push_back(w.param.detach().clone().requires_grad_(true));
  torch::optim::AdamW torch_adamw(reference, torch::optim::AdamWOptions(1e-3)
                                                 .betas({settings.beta1, settings.beta2})
                                                 .eps(settings.eps)
                                                 .weight_decay(settings.weight_decay));

  at::manual_seed(7);
  const double max_norms[] = {0.5, 1e9, 2.0}, lrs[] = {1e-2, 3e-2, 2e-2};
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    for (size_t i = 0; i < weights.size(); ++i) {
      const at::Tensor grad = at::randn(weights[i].param.sizes()) * 0.1;
      reference[i].mutable_grad() = grad.clone();
      if (weights[i].expert_grad.empty()) {
        weights[i].param.mutable_grad() = grad.clone();
      } else {
        std::copy_n(grad.data_ptr<float>(), grad.numel(), weights[i].expert_grad.data());
      }
    }
    const double norm = optimizer.clipGradNorm(max_norms[step]);
    const double want_norm = torch::nn::utils::clip_grad_norm_(reference, max_norms[step]);
    EXPECT_NEAR(norm, want_norm, 1e-5 * want_norm);
    static_cast<torch::optim::AdamWOptions&>(torch_adamw.param_groups()[0].options()).lr(lrs[step]);
    optimizer.step(lrs[step]);
    torch_adamw.step();
    optimizer.zeroGrad();
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    const double scale = reference[i].abs().max().item<double>();
    EXPECT_LE((weights[i].param - reference[i]).abs().max().item<double>(), 1e-6 * scale + 1e-7)
        << "weight " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(LoraExperts, LoraOptimizerTest, ::testing::Values(0, 2));

}  // namespace
}  // namespace tandem::model
