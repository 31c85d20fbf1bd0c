// experts_mode auto against all-CPU co-computation: whatever the split decides (each expert
// resident, streamed or on the CPU engine, changing from call to call, the resident cache
// re-placed mid-run), the loss and every gradient (the router's and the torch side's LoRA, d
// hidden through them, every expert's LoRA) are those of the CPU engine computing every pair.
// On the CPU device the "device" is the CPU: torch computes the resident and streamed experts
// there, so all three paths run; the device run of this binary adds cuda:0.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"
#include "engine/io/lora_target.h"
#include "engine/io/model_config.h"
#include "engine/model/causal_lm.h"
#include "engine/model/lora_gradients_test_util.h"
#include "engine/model/model_resolver.h"
#include "engine/model/moe_block.h"
#include "engine/model/moe_function.h"
#include "engine/model/tiny_moe_test_util.h"

namespace tandem::model {
namespace {

struct Pass {
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;  // accumulated over the passes so far
};

struct TrainRun {
  std::vector<Pass> passes;
  SplitExperts::Counts counts;                      // both layers
  std::vector<std::vector<int64_t>> resident_sets;  // layer 0's cache after each pass
};

struct TrainSetup {
  ExpertsMode experts = ExpertsMode::Cpu;
  ExpertSplitChoice split = ExpertSplitChoice::Cycle;
  int64_t gpu_experts = 0;
  int64_t refresh = 1;
  bool checkpointing = false;
  bool keep = false;
  placement::Device device = placement::Device::cpu();
  std::optional<placement::MachineRates> rates;  // the cost model's; nullopt: the preset's
};

// Flat rates (one curve point) of a CPU engine, a GPU's expert products and its link. With the
// tiny model's experts (H 48, I 24, about 8 pairs each) at 1, 3 and 1 G/s, a call streams 3 of
// the 4 non-resident experts and keeps the coldest on the CPU.
placement::MachineRates flatRates(double cpu_flops, double gpu_flops, double link_bytes_per_s) {
  placement::MachineRates rates;
  placement::ExpertEngineRates cpu;
  cpu.format = "bf16";
  cpu.curve.points = {{4, cpu_flops, cpu_flops}};
  rates.cpu = {cpu};  // the tiny model's experts' format or not: cpuFor falls back to it
  placement::GpuRates gpu;
  gpu.host_to_device_bytes_per_s = link_bytes_per_s;
  gpu.device_to_host_bytes_per_s = link_bytes_per_s;
  gpu.expert_gemm.points = {{4, gpu_flops, gpu_flops}};
  gpu.clearFittedTerms();  // the products and copies alone
  rates.gpus.push_back(gpu);
  return rates;
}

// `passes` forward + backward passes on different tokens, the gradients accumulating (no optimizer
// step, so every pass of both runs differentiates the same weights).
TrainRun train(const TrainSetup& s, int passes) {
  const io::ModelConfig config = testing::tinyQwen2MoeConfig();
  ModelOptions options;
  options.device = s.device;
  options.experts = s.experts;
  options.experts_backend = "generic";  // fp32 products, as torch's
  options.gradient_checkpointing = s.checkpointing;
  options.keep_expert_forward = s.keep;
  options.gpu_experts.assign(2, s.gpu_experts);
  options.expert_split = s.split;
  options.resident_refresh_steps = s.refresh;
  options.expert_split_rates = s.rates;
  const LoraPlan plan =
      loraPlanFromTarget(io::LoraTarget::parse("all"), gpu::LoraSettings{4, 8.0, false, 0.0});
  auto model = CausalLm::random(config, options, &plan, /*seed=*/3, ThreadPool::global());
  model->visitMoeBlocks([](const std::string&, MoeBlock& block) {  // B ≠ 0: expert LoRA matters
    for (auto proj :
         {experts::ExpertProj::Gate, experts::ExpertProj::Up, experts::ExpertProj::Down}) {
      for (float& b : block.experts->lora().allB(proj)) b = 0.01f;
    }
  });
  TrainRun run;
  for (int p = 0; p < passes; ++p) {
    const at::Tensor ids =
        (at::arange(24, at::kLong) * (p + 1) + p).remainder(config.vocab_size).view({2, 12});
    const at::Tensor loss = model->loss(model->forwardHidden(ids, /*training=*/true), ids);
    loss.backward();
    Pass pass;
    pass.loss = loss.item<float>();
    pass.grads = testing::loraGradients(*model);
    bool first = true;
    model->visitMoeBlocks([&](const std::string&, MoeBlock& block) {
      if (block.split && first) run.resident_sets.push_back(block.split->residentExperts());
      first = false;
    });
    run.passes.push_back(std::move(pass));
  }
  model->visitMoeBlocks([&](const std::string&, MoeBlock& block) {
    if (!block.split) return;
    const SplitExperts::Counts c = block.split->counts();
    run.counts.calls += c.calls;
    run.counts.resident_pairs += c.resident_pairs;
    run.counts.streamed_pairs += c.streamed_pairs;
    run.counts.cpu_pairs += c.cpu_pairs;
    run.counts.refreshes += c.refreshes;
  });
  return run;
}

// Every gradient within 1e-4 of its tensor's largest (moe_function_test's tolerance for torch
// against the CPU engine in fp32), the loss within 1e-5 relative; and the gradients carry signal.
void expectSameNumbers(const TrainRun& got, const TrainRun& want) {
  ASSERT_EQ(got.passes.size(), want.passes.size());
  for (size_t p = 0; p < want.passes.size(); ++p) {
    SCOPED_TRACE("pass " + std::to_string(p));
    const Pass& g = got.passes[p];
    const Pass& w = want.passes[p];
    EXPECT_NEAR(g.loss, w.loss, 1e-5f * std::abs(w.loss));
    ASSERT_EQ(g.grads.size(), w.grads.size());
    for (const auto& [name, expected] : w.grads) {
      const std::vector<float>& actual = g.grads.at(name);
      ASSERT_EQ(actual.size(), expected.size()) << name;
      float scale = 0, worst = 0;
      for (size_t i = 0; i < expected.size(); ++i) {
        scale = std::max(scale, std::abs(expected[i]));
        worst = std::max(worst, std::abs(actual[i] - expected[i]));
      }
      EXPECT_LE(worst, 1e-4f * scale + 1e-9f) << name;
      // PEFT's B = 0 makes the torch side's grad A zero; every other gradient carries signal.
      if (name.ends_with(".A") && name.find(".experts.") == std::string::npos) continue;
      EXPECT_GT(scale, 0.0f) << name;
    }
  }
}

std::vector<placement::Device> devices() {
  std::vector<placement::Device> out{placement::Device::cpu()};
  if (at::hasCUDA()) out.push_back(placement::Device::cuda(0));
  return out;
}

// The cycling policy sends expert e to path (e + call) mod 3: over three passes (and the
// recomputations of checkpointing) every expert is resident, streamed and the CPU's, the split
// changes every call and the resident cache is re-placed after every pass.
TEST(SplitExperts, EveryExpertThroughEveryPathGivesTheCpuEnginesNumbers) {
  for (const placement::Device device : devices()) {
    TrainSetup cpu;
    cpu.device = device;
    const TrainRun want = train(cpu, 3);
    for (const auto& [checkpointing, keep] :
         {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
      SCOPED_TRACE(device.str() + ", checkpointing " + std::to_string(checkpointing) + ", keep " +
                   std::to_string(keep));
      TrainSetup split = cpu;
      split.experts = ExpertsMode::Auto;
      split.checkpointing = checkpointing;
      split.keep = keep;
      const TrainRun got = train(split, 3);
      expectSameNumbers(got, want);
      EXPECT_GT(got.counts.resident_pairs, 0);
      EXPECT_GT(got.counts.streamed_pairs, 0);
      EXPECT_GT(got.counts.cpu_pairs, 0);
      EXPECT_EQ(got.counts.calls, (checkpointing ? 2 : 1) * 2 * 3);
      EXPECT_GE(got.counts.refreshes, 2 * 2);  // both layers, after passes 1 and 2
      ASSERT_EQ(got.resident_sets.size(), 3u);
      EXPECT_NE(got.resident_sets[0], got.resident_sets[1]);
      EXPECT_NE(got.resident_sets[1], got.resident_sets[2]);
    }
  }
}

// The cost model's policy on rates where the GPU is 3 times the CPU and the link costs about an
// expert's CPU time (so some experts are streamed, some stay on the CPU), a cache of 2
// most-routed experts re-placed every second pass, and no refresh at all: the same numbers,
// whatever it chose.
TEST(SplitExperts, TheBalancingPolicyGivesTheCpuEnginesNumbers) {
  for (const placement::Device device : devices()) {
    TrainSetup cpu;
    cpu.device = device;
    const TrainRun want = train(cpu, 4);
    for (const int64_t refresh : {int64_t{2}, int64_t{0}}) {
      SCOPED_TRACE(device.str() + ", refresh " + std::to_string(refresh));
      TrainSetup split = cpu;
      split.experts = ExpertsMode::Auto;
      split.split = ExpertSplitChoice::Balance;
      split.gpu_experts = 2;
      split.refresh = refresh;
      split.rates = flatRates(1e9, 3e9, 1e9);
      const TrainRun got = train(split, 4);
      expectSameNumbers(got, want);
      EXPECT_GT(got.counts.resident_pairs, 0);
      EXPECT_GT(got.counts.streamed_pairs, 0);
      EXPECT_GT(got.counts.cpu_pairs, 0);
      EXPECT_EQ(got.counts.resident_pairs + got.counts.streamed_pairs + got.counts.cpu_pairs,
                2 * 4 * 24 * 2);  // layers x passes x tokens x top-k
      for (const auto& set : got.resident_sets) EXPECT_EQ(set.size(), 2u);
      if (refresh == 0) {
        EXPECT_EQ(got.counts.refreshes, 0);
      }
    }
  }
}

// With the CPU made very slow every non-resident expert is streamed, with copies made very slow
// none is: the CPU engine is then not called at all, or computes every non-resident pair.
TEST(SplitExperts, TheRatesMoveTheSplit) {
  const io::ModelConfig config = testing::tinyQwen2MoeConfig();
  auto run = [&](const placement::MachineRates& rates) {
    ModelOptions options;
    options.experts = ExpertsMode::Auto;
    options.experts_backend = "generic";
    options.gpu_experts.assign(2, 1);
    options.expert_split_rates = rates;
    auto model = CausalLm::random(config, options, nullptr, /*seed=*/3, ThreadPool::global());
    at::NoGradGuard no_grad;
    model->forwardHidden(at::arange(24, at::kLong).remainder(config.vocab_size).view({2, 12}),
                         false);
    SplitExperts::Counts counts;
    model->visitMoeBlocks([&](const std::string&, MoeBlock& block) {
      counts.streamed_pairs += block.split->counts().streamed_pairs;
      counts.cpu_pairs += block.split->counts().cpu_pairs;
    });
    return counts;
  };
  const SplitExperts::Counts streamed = run(flatRates(1, 1e12, 1e12));
  EXPECT_EQ(streamed.cpu_pairs, 0);
  EXPECT_GT(streamed.streamed_pairs, 0);
  const SplitExperts::Counts on_cpu = run(flatRates(1e9, 1e12, 1));
  EXPECT_EQ(on_cpu.streamed_pairs, 0);
  EXPECT_GT(on_cpu.cpu_pairs, 0);
}

// The memory plan of an auto training run charges the split (placement's SplitExpertsMemory
// tests check the bytes); chat, other modes and a cache never re-placed do not (or not the
// incoming cache).
TEST(SplitExperts, PlanRequestsOfAutoTrainingChargeTheSplit) {
  const io::ModelConfig config = testing::tinyQwen2MoeConfig();
  ModelRequest request;
  request.experts_mode = "auto";
  placement::PlanRequest plan = planRequestFor(request, config);
  EXPECT_TRUE(plan.split_experts);
  EXPECT_TRUE(plan.split_refresh);
  request.resident_refresh_steps = 0;
  EXPECT_FALSE(planRequestFor(request, config).split_refresh);
  request.training = false;
  EXPECT_FALSE(planRequestFor(request, config).split_experts);
  request.training = true;
  request.experts_mode = "cpu";
  EXPECT_FALSE(planRequestFor(request, config).split_experts);
}

}  // namespace
}  // namespace tandem::model
