#include "engine/model/expert_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "engine/core/error.h"

namespace tandem::model {
namespace {

// Qwen3-30B-A3B's expert shape: H 2048, I 768, 9.4 MB of bf16 weights an expert.
const experts::ExpertLayerSpec kSpec{8, 2048, 768};
constexpr double kExpertBytes = 3.0 * 2048 * 768 * 2;
constexpr double kFlopsPerToken = 6.0 * 2048 * 768;  // gate, up, down: 2 FLOP per multiply-add

// Rates that are flat in tokens per expert (one curve point: the same rate everywhere), so a
// split's predicted times can be written out by hand below.
placement::MachineRates flatRates(double cpu_flops, double gpu_flops, double link_bytes_per_s,
                                  double cpu_call_ms = 0) {
  placement::MachineRates rates;
  rates.source = "test";
  placement::ExpertEngineRates cpu;
  cpu.backend = "generic";
  cpu.format = "bf16";
  cpu.curve.points = {{64, cpu_flops, cpu_flops}};
  cpu.forward_call_ms = cpu_call_ms;
  cpu.backward_call_ms = cpu_call_ms;
  rates.cpu.push_back(cpu);
  placement::GpuRates gpu;
  gpu.name = "test GPU";
  gpu.host_to_device_bytes_per_s = link_bytes_per_s;
  gpu.device_to_host_bytes_per_s = link_bytes_per_s;
  gpu.expert_gemm.points = {{64, gpu_flops, gpu_flops}};
  gpu.clearFittedTerms();  // the products and copies alone
  rates.gpus.push_back(gpu);
  return rates;
}

std::unique_ptr<ExpertSplitPolicy> costModelPolicy(const placement::MachineRates& rates) {
  return makeExpertSplitPolicy(ExpertSplitChoice::Balance, rates, kSpec, kExpertBytes, "bf16", 0);
}

ExpertSplit splitOf(ExpertSplitPolicy& policy, const std::vector<int64_t>& pairs,
                    const std::vector<int64_t>& resident, bool graph = true) {
  return policy.split({pairs, resident, graph});
}

// Milliseconds of `tokens` on a flat rate, forward and backward of one call that builds a graph.
double callMs(double flops_per_s, int64_t tokens) {
  return 2.0 * 1e3 * kFlopsPerToken * static_cast<double>(tokens) / flops_per_s;
}

// A CPU ten times faster than the GPU's expert products keeps every expert on the CPU, even with
// a copy engine that costs nothing: moving any expert would make the GPU the slower side.
TEST(CostModelSplitPolicy, ACpuTenTimesFasterKeepsEverythingOnTheCpu) {
  const auto policy = costModelPolicy(flatRates(10e12, 1e12, 1e18));
  const std::vector<int64_t> pairs{90, 40, 25, 18, 12, 7, 3, 1};
  const ExpertSplit split = splitOf(*policy, pairs, {});
  EXPECT_TRUE(split.streamed.empty());
  EXPECT_EQ(split.cpu, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  double cpu_ms = 0;
  for (const int64_t t : pairs) cpu_ms += callMs(10e12, t);
  EXPECT_NEAR(split.cpu_ms, cpu_ms, 1e-9 * cpu_ms);
  EXPECT_EQ(split.gpu_ms, 0.0);
}

// A free copy engine and a GPU much faster than the CPU: the hot experts are streamed, hottest
// first, and every streamed expert is at least as routed as every one the CPU keeps.
TEST(CostModelSplitPolicy, AFreeCopyEngineStreamsTheHotExperts) {
  const auto policy = costModelPolicy(flatRates(1e12, 100e12, 1e18));
  const std::vector<int64_t> pairs{3, 90, 7, 40, 1, 25, 12, 18};
  const ExpertSplit split = splitOf(*policy, pairs, {});
  ASSERT_FALSE(split.streamed.empty());
  EXPECT_EQ(split.streamed.front(), 1);  // the hottest
  int64_t coldest_streamed = 1 << 30, hottest_on_cpu = 0;
  for (const int64_t e : split.streamed) coldest_streamed = std::min(coldest_streamed, pairs[e]);
  for (const int64_t e : split.cpu) hottest_on_cpu = std::max(hottest_on_cpu, pairs[e]);
  EXPECT_GE(coldest_streamed, hottest_on_cpu);
  EXPECT_EQ(split.streamed.size() + split.cpu.size(), pairs.size());
}

// Many equally routed experts, a free copy engine, a GPU three times the CPU's rate: the split
// leaves the predicted CPU and GPU times within one expert's cost of each other, and those times
// are the hand-written sums of the experts each side got.
TEST(CostModelSplitPolicy, BalanceEqualisesThePredictedCpuAndGpuTimes) {
  const double cpu_rate = 1e12, gpu_rate = 3e12;
  const auto policy = costModelPolicy(flatRates(cpu_rate, gpu_rate, 1e18));
  const std::vector<int64_t> pairs(64, 32);
  const ExpertSplit split = splitOf(*policy, pairs, {});
  const double cpu_ms = callMs(cpu_rate, 32) * static_cast<double>(split.cpu.size());
  const double gpu_ms = callMs(gpu_rate, 32) * static_cast<double>(split.streamed.size());
  EXPECT_NEAR(split.cpu_ms, cpu_ms, 1e-9 * cpu_ms);
  EXPECT_NEAR(split.gpu_ms, gpu_ms, 1e-9 * gpu_ms);
  EXPECT_LE(std::abs(cpu_ms - gpu_ms), callMs(cpu_rate, 32));
  // 3 : 1 in rate: the GPU takes about three quarters of the experts.
  EXPECT_NEAR(static_cast<double>(split.streamed.size()), 48.0, 1.0);
}

// A slow link streams fewer: each streamed expert costs its copy (twice on a call that builds a
// graph: forward and backward each copy it), so the copy engine becomes the slower side first.
TEST(CostModelSplitPolicy, ASlowerLinkStreamsFewer) {
  const std::vector<int64_t> pairs(64, 32);
  const auto fast = costModelPolicy(flatRates(1e12, 100e12, 1e18));
  const auto slow = costModelPolicy(flatRates(1e12, 100e12, 2e9));
  const size_t fast_streamed = splitOf(*fast, pairs, {}).streamed.size();
  const ExpertSplit s = splitOf(*slow, pairs, {});
  EXPECT_LT(s.streamed.size(), fast_streamed);
  EXPECT_GT(s.streamed.size(), 0u);
  const double copy_ms = 2.0 * 1e3 * kExpertBytes / 2e9;  // forward and backward
  EXPECT_NEAR(s.copy_ms, copy_ms * static_cast<double>(s.streamed.size()), 1e-6);
  EXPECT_LE(std::abs(s.copy_ms - s.cpu_ms), std::max(copy_ms, callMs(1e12, 32)));
}

// A call that builds no graph (inference, checkpointing's first forward) is priced by the
// forward alone; one that does by forward + backward, the copies counted twice.
TEST(CostModelSplitPolicy, ACallThatBuildsAGraphIsPricedForwardAndBackward) {
  placement::MachineRates rates = flatRates(1e12, 10e12, 20e9, 0.5);
  rates.cpu[0].curve.points[0].backward_flops_per_s = 0.5e12;
  auto made = costModelPolicy(rates);
  const auto* policy = dynamic_cast<const CostModelSplitPolicy*>(made.get());
  ASSERT_NE(policy, nullptr);
  const placement::LayerCosts& forward = policy->costs(false);
  const placement::LayerCosts& both = policy->costs(true);
  EXPECT_NEAR(forward.cpuMs(10), 1e3 * kFlopsPerToken * 10 / 1e12, 1e-12);
  EXPECT_NEAR(both.cpuMs(10), 1e3 * kFlopsPerToken * 10 * (1 / 1e12 + 1 / 0.5e12), 1e-12);
  EXPECT_NEAR(forward.copyMs(), 1e3 * kExpertBytes / 20e9, 1e-12);
  EXPECT_NEAR(both.copyMs(), 2 * 1e3 * kExpertBytes / 20e9, 1e-12);
  EXPECT_DOUBLE_EQ(forward.cpu_call_ms, 0.5);
  EXPECT_DOUBLE_EQ(both.cpu_call_ms, 1.0);
  const std::vector<int64_t> pairs{5, 9, 0, 2};
  EXPECT_EQ(made->split({pairs, {}, true}).cpu_ms, placement::splitLayer(both, pairs, {}).cpu_ms);
  EXPECT_EQ(made->split({pairs, {}, false}).cpu_ms,
            placement::splitLayer(forward, pairs, {}).cpu_ms);
}

// Resident experts are the GPU's and never streamed; without the device's GPU rates (a GPU the
// presets do not know, not calibrated) nothing is streamed and the resident ones still run there.
TEST(CostModelSplitPolicy, ResidentExpertsStayWhereTheyAre) {
  const std::vector<int64_t> pairs{90, 40, 25, 18, 12, 7, 3, 1};
  const std::vector<int64_t> resident{0, 3};
  const auto policy = costModelPolicy(flatRates(1e12, 100e12, 1e18));
  ExpertSplit split = splitOf(*policy, pairs, resident);
  EXPECT_EQ(split.resident, resident);
  for (const int64_t e : split.streamed) EXPECT_TRUE(e != 0 && e != 3) << e;
  for (const int64_t e : split.cpu) EXPECT_TRUE(e != 0 && e != 3) << e;
  placement::MachineRates no_gpu = flatRates(1e12, 100e12, 1e18);
  no_gpu.gpus.clear();
  split = splitOf(*costModelPolicy(no_gpu), pairs, resident);
  EXPECT_EQ(split.resident, resident);
  EXPECT_TRUE(split.streamed.empty());
  EXPECT_EQ(split.cpu, (std::vector<int64_t>{1, 2, 4, 5, 6, 7}));
}

TEST(ExpertSplitPolicy, TheResidentCacheIsTheMostRouted) {
  const auto policy = costModelPolicy(flatRates(1e12, 1e12, 1e10));
  const std::vector<int64_t> pairs{3, 9, 9, 0, 12, 1};
  EXPECT_EQ(policy->resident(pairs, 2), (std::vector<int64_t>{1, 4}));  // ties: lower id
  EXPECT_EQ(policy->resident(pairs, 3), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(policy->resident(pairs, 0), std::vector<int64_t>{});
  EXPECT_EQ(policy->resident(pairs, 99).size(), pairs.size());
}

// Over three calls every expert with pairs takes each path: resident (the cache the policy
// picks for that call), streamed, CPU.
TEST(CyclingSplitPolicy, EveryExpertTakesEveryPath) {
  CyclingSplitPolicy policy;
  const std::vector<int64_t> pairs{1, 2, 3, 4, 5, 6, 7};
  std::vector<std::vector<int>> paths(pairs.size());  // per expert: 0 resident, 1 streamed, 2 CPU
  for (int call = 0; call < 3; ++call) {
    const std::vector<int64_t> resident = policy.resident(pairs, 2);
    const ExpertSplit split = splitOf(policy, pairs, resident);
    for (int64_t e : split.resident) paths[static_cast<size_t>(e)].push_back(0);
    for (int64_t e : split.streamed) paths[static_cast<size_t>(e)].push_back(1);
    for (int64_t e : split.cpu) paths[static_cast<size_t>(e)].push_back(2);
  }
  for (auto& p : paths) {
    std::sort(p.begin(), p.end());
    EXPECT_EQ(p, (std::vector<int>{0, 1, 2}));
  }
}

TEST(ExpertSplitChoice, ParsesItsNames) {
  EXPECT_EQ(parseExpertSplit("balance"), ExpertSplitChoice::Balance);
  EXPECT_EQ(parseExpertSplit("cycle"), ExpertSplitChoice::Cycle);
  EXPECT_THROW(parseExpertSplit("greedy"), Error);
  const placement::MachineRates rates = flatRates(1e12, 1e12, 1e10);
  EXPECT_NE(dynamic_cast<CyclingSplitPolicy*>(
                makeExpertSplitPolicy(ExpertSplitChoice::Cycle, rates, kSpec, 1, "bf16", 0).get()),
            nullptr);
  EXPECT_NE(
      dynamic_cast<CostModelSplitPolicy*>(
          makeExpertSplitPolicy(ExpertSplitChoice::Balance, rates, kSpec, 1, "bf16", 0).get()),
      nullptr);
}

}  // namespace
}  // namespace tandem::model
