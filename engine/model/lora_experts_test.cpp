// LoRA experts (issue 32) inside the model: a zero-initialised LE leaves step 0 exactly as the
// model without it, gradients reach it through gradient checkpointing's recomputation, and the
// adapter dir round trip (write, read, rebuild, apply) gives the same model. The parity of its
// forward and gradients with an independent PyTorch reference is tests/parity/test_lora_experts.py.

#include "engine/model/lora_experts.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <filesystem>
#include <map>
#include <string>

#include "engine/core/thread_pool.h"
#include "engine/io/lora_target.h"
#include "engine/model/causal_lm.h"
#include "engine/model/lora_experts_files.h"
#include "engine/model/peft_adapter.h"
#include "engine/model/tiny_moe_test_util.h"

namespace tandem::model {
namespace {

LoraPlan planWith(int64_t lora_experts) {
  LoraPlan plan =
      loraPlanFromTarget(io::LoraTarget::parse("all"), gpu::LoraSettings{4, 8.0, false, 0.0});
  plan.seed = 11;
  plan.lora_experts = lora_experts;
  plan.le_dim = 8;
  return plan;
}

std::unique_ptr<CausalLm> tinyModel(const LoraPlan& plan, bool checkpointing = false) {
  ModelOptions options;
  options.gradient_checkpointing = checkpointing;
  return CausalLm::random(testing::tinyQwen3MoeConfig(/*num_experts=*/4), options, &plan,
                          /*seed=*/3, ThreadPool::global());
}

struct Batch {
  at::Tensor ids = at::randint(1, 64, {2, 12}, at::kLong);
  at::Tensor labels = ids.clone();
};

// Loss and every gradient (LoRA and LE) of one forward and backward in training mode.
std::map<std::string, at::Tensor> lossAndGrads(CausalLm& model, const Batch& batch) {
  const at::Tensor loss = model.loss(model.forwardHidden(batch.ids, true), batch.labels);
  torch::autograd::backward({loss});
  std::map<std::string, at::Tensor> out = loraTensors(model, /*gradients=*/true);
  out["loss"] = loss.detach();
  model.visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
    block.lora_experts.visitWeights(mlp, [&](const std::string& name, at::Tensor& w) {
      out[name] = w.grad().defined() ? w.grad().clone() : at::zeros_like(w);
    });
  });
  return out;
}

TEST(LoraExperts, FreshOnesLeaveStepZeroExactlyAsWithout) {
  at::manual_seed(1);
  const Batch batch;
  auto without = tinyModel(planWith(0));
  auto with = tinyModel(planWith(2));
  int layers = 0;
  with->visitMoeBlocks([&](const std::string&, MoeBlock& block) {
    ASSERT_EQ(block.lora_experts.count(), 2);
    ASSERT_EQ(block.lora_experts.dim(), 8);
    ++layers;
  });
  ASSERT_EQ(layers, 2);
  const auto a = lossAndGrads(*without, batch);
  const auto b = lossAndGrads(*with, batch);
  EXPECT_TRUE(at::equal(a.at("loss"), b.at("loss")))
      << a.at("loss").item<double>() << " vs " << b.at("loss").item<double>();
  for (const auto& [name, grad] : a) EXPECT_TRUE(at::equal(grad, b.at(name))) << name;
  // down is zero: gate and up get no gradient yet, down does (it is where LE starts learning).
  double down_norm = 0;
  for (const auto& [name, grad] : b) {
    if (name.find(".lora_experts.") == std::string::npos) continue;
    if (name.find("down_proj") != std::string::npos) {
      down_norm += grad.norm().item<double>();
    } else {
      EXPECT_EQ(grad.abs().max().item<double>(), 0.0) << name;
    }
  }
  EXPECT_GT(down_norm, 0.0);
}

// Once down moves, LE changes the output, and checkpointing's recomputation gives it the same
// gradients as the plain backward.
TEST(LoraExperts, GradientsSurviveCheckpointRecomputation) {
  at::manual_seed(2);
  const Batch batch;
  auto plain = tinyModel(planWith(1));
  auto checkpointed = tinyModel(planWith(1), /*checkpointing=*/true);
  for (CausalLm* m : {plain.get(), checkpointed.get()}) {
    m->visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
      at::NoGradGuard no_grad;
      block.lora_experts.visitWeights(mlp, [&](const std::string& name, at::Tensor& w) {
        if (name.find("down_proj") != std::string::npos) w.fill_(0.05);
      });
    });
  }
  const auto a = lossAndGrads(*plain, batch);
  const auto b = lossAndGrads(*checkpointed, batch);
  int le_grads = 0;
  for (const auto& [name, grad] : a) {
    const double scale = grad.abs().max().item<double>();
    EXPECT_LE((grad - b.at(name)).abs().max().item<double>(), 1e-6 * scale + 1e-9) << name;
    if (name.find(".lora_experts.") != std::string::npos) {
      EXPECT_GT(scale, 0.0) << name;
      ++le_grads;
    }
  }
  EXPECT_EQ(le_grads, 2 * 3);
  auto without = tinyModel(planWith(0));
  const auto c = lossAndGrads(*without, batch);
  EXPECT_GT(std::abs(a.at("loss").item<double>() - c.at("loss").item<double>()), 1e-6);
}

TEST(LoraExperts, AdapterDirRoundTripGivesTheSameModel) {
  at::manual_seed(3);
  const Batch batch;
  auto trained = tinyModel(planWith(2));
  trained->visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
    at::NoGradGuard no_grad;
    block.lora_experts.visitWeights(
        mlp, [&](const std::string&, at::Tensor& w) { w.copy_(at::randn(w.sizes()) * 0.2); });
  });
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "lora_experts_round_trip";
  std::filesystem::remove_all(dir);
  writePeftAdapter(*trained, planWith(2).settings, dir, ExpertAdapterForm::Fused, "tiny");
  ASSERT_TRUE(std::filesystem::exists(dir / kLoraExpertsWeightsFile));
  const PeftAdapter adapter = readPeftAdapter(dir, trained->config());
  EXPECT_EQ(adapter.lora_experts.count, 2);
  EXPECT_EQ(adapter.lora_experts.le_dim, 8);
  const LoraPlan plan = loraPlanFor(adapter);
  EXPECT_EQ(plan.lora_experts, 2);
  auto loaded =
      CausalLm::random(trained->config(), ModelOptions{}, &plan, /*seed=*/3, ThreadPool::global());
  applyPeftAdapter(adapter, *loaded);
  at::NoGradGuard no_grad;
  const at::Tensor want = trained->forwardHidden(batch.ids, false);
  const at::Tensor got = loaded->forwardHidden(batch.ids, false);
  EXPECT_TRUE(at::equal(want, got));

  // A model without LE writes no LE files, and removes those an earlier save left.
  auto plain = tinyModel(planWith(0));
  writePeftAdapter(*plain, planWith(0).settings, dir, ExpertAdapterForm::Fused, "tiny");
  EXPECT_FALSE(std::filesystem::exists(dir / kLoraExpertsWeightsFile));
  EXPECT_FALSE(std::filesystem::exists(dir / kLoraExpertsConfigFile));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::model
