#include "engine/placement/expert_split_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "engine/core/error.h"

namespace tandem::placement {
namespace {

// Qwen3-30B-A3B's expert shape on rates of the H200 machine's order: a CPU that is 20 times
// slower than the GPU per expert, a copy of one bf16 expert (9.4 MB) at 54 GB/s ≈ 0.17 ms.
LayerCosts h200Like() {
  LayerCosts c;
  c.hidden = 2048;
  c.intermediate = 768;
  c.cpu = {{{1, 0.05e12, 0.04e12}, {512, 4e12, 3.3e12}}};
  c.has_gpu = true;
  c.gpu_gemm = {{{1, 2e12, 2e12}, {512, 500e12, 500e12}}};
  c.expert_bytes = 3.0 * 2048 * 768 * 2;
  c.host_to_device_bytes_per_s = 54e9;
  return c;
}

std::vector<int64_t> skewed(int64_t experts) {  // expert e gets 2 · (E - e) pairs
  std::vector<int64_t> tokens(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) tokens[static_cast<size_t>(e)] = 2 * (experts - e);
  return tokens;
}

double cpuSum(const LayerCosts& c, const std::vector<int64_t>& tokens,
              const std::vector<int64_t>& ids) {
  double ms = 0;
  for (const int64_t id : ids) ms += c.cpuMs(tokens[static_cast<size_t>(id)]);
  return ms;
}

TEST(ExpertSplit, WithoutAGpuEverythingStaysOnTheCpu) {
  LayerCosts costs = h200Like();
  costs.has_gpu = false;
  const std::vector<int64_t> tokens = skewed(16);
  const ExpertSplit split = splitLayer(costs, tokens, {});
  EXPECT_TRUE(split.streamed.empty());
  EXPECT_TRUE(split.resident.empty());
  std::vector<int64_t> all(16);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(split.cpu, all);
  EXPECT_NEAR(split.cpu_ms, cpuSum(costs, tokens, all), 1e-9);
  EXPECT_EQ(split.gpu_ms, 0);
  EXPECT_EQ(split.copy_ms, 0);
  const std::vector<int64_t> resident = {3};
  EXPECT_THROW(splitLayer(costs, tokens, resident), Error);
}

TEST(ExpertSplit, HotExpertsAreStreamedFirst) {
  const LayerCosts costs = h200Like();
  std::vector<int64_t> tokens = skewed(64);
  std::reverse(tokens.begin(), tokens.end());  // hottest last: the order must not matter
  const ExpertSplit split = splitLayer(costs, tokens, {});
  ASSERT_FALSE(split.streamed.empty());
  ASSERT_FALSE(split.cpu.empty());
  // Every streamed expert has at least as many tokens as every expert left on the CPU, and the
  // streamed list is hottest first.
  int64_t coldest_streamed = tokens[static_cast<size_t>(split.streamed.back())];
  for (const int64_t id : split.cpu) EXPECT_LE(tokens[static_cast<size_t>(id)], coldest_streamed);
  for (size_t i = 1; i < split.streamed.size(); ++i)
    EXPECT_GE(tokens[static_cast<size_t>(split.streamed[i - 1])],
              tokens[static_cast<size_t>(split.streamed[i])]);
  EXPECT_EQ(split.streamed.front(), 63);
  EXPECT_EQ(split.streamed.size() + split.cpu.size(), 64u);
}

TEST(ExpertSplit, ResidentExpertsStayOnTheGpuAndAreNeverStreamed) {
  const LayerCosts costs = h200Like();
  const std::vector<int64_t> tokens = skewed(32);
  const std::vector<int64_t> resident = {0, 5, 31};  // the hottest, a middle one, the coldest
  const ExpertSplit split = splitLayer(costs, tokens, resident);
  EXPECT_EQ(split.resident, resident);
  for (const int64_t id : resident) {
    EXPECT_EQ(std::count(split.streamed.begin(), split.streamed.end(), id), 0);
    EXPECT_EQ(std::count(split.cpu.begin(), split.cpu.end(), id), 0);
  }
  EXPECT_EQ(split.resident.size() + split.streamed.size() + split.cpu.size(), 32u);
  // The hottest non-resident expert (1) is the first streamed.
  ASSERT_FALSE(split.streamed.empty());
  EXPECT_EQ(split.streamed.front(), 1);
  const std::vector<int64_t> out_of_range = {32};
  EXPECT_THROW(splitLayer(costs, tokens, out_of_range), Error);
}

TEST(ExpertSplit, CpuAndGpuFinishWithinOneExpertsCost) {
  for (const double copy_rate : {54e9, 25e9, 8e9}) {
    LayerCosts costs = h200Like();
    costs.host_to_device_bytes_per_s = copy_rate;
    costs.gpu_base_ms = 0.3;  // shared experts beside
    const std::vector<int64_t> tokens = skewed(128);
    const ExpertSplit split = splitLayer(costs, tokens, {});
    ASSERT_FALSE(split.cpu.empty()) << copy_rate;
    ASSERT_FALSE(split.streamed.empty()) << copy_rate;
    double largest = costs.copyMs();
    for (const int64_t t : tokens) largest = std::max({largest, costs.cpuMs(t), costs.gpuMs(t)});
    const double gpu_side = std::max(split.gpu_ms, split.copy_ms);
    EXPECT_LE(std::abs(split.cpu_ms - gpu_side), largest) << copy_rate;
    // The split beats both extremes: everything on the CPU and everything streamed.
    EXPECT_LT(split.finishMs(),
              cpuSum(costs, tokens, split.cpu) + cpuSum(costs, tokens, split.streamed));
    EXPECT_LE(split.finishMs(), 128 * costs.copyMs() + 1e-9);
    // Busy times add up from the per-expert costs.
    double cpu = 0, gpu = costs.gpu_base_ms;
    for (const int64_t id : split.cpu) cpu += costs.cpuMs(tokens[static_cast<size_t>(id)]);
    for (const int64_t id : split.streamed) gpu += costs.gpuMs(tokens[static_cast<size_t>(id)]);
    EXPECT_NEAR(split.cpu_ms, cpu, 1e-9);
    EXPECT_NEAR(split.gpu_ms, gpu, 1e-9);
    EXPECT_NEAR(split.copy_ms, static_cast<double>(split.streamed.size()) * costs.copyMs(), 1e-9);
  }
}

TEST(ExpertSplit, AHeadStartForTheCopiesStreamsMore) {
  LayerCosts costs = h200Like();
  costs.host_to_device_bytes_per_s = 8e9;  // copy-bound
  const std::vector<int64_t> tokens = skewed(128);
  const size_t without = splitLayer(costs, tokens, {}).streamed.size();
  costs.copy_head_start_ms = 5;
  const size_t with = splitLayer(costs, tokens, {}).streamed.size();
  EXPECT_GT(with, without);
}

TEST(ExpertSplit, ExpertsWithoutTokensAreNotStreamed) {
  const LayerCosts costs = h200Like();
  std::vector<int64_t> tokens(16, 0);
  tokens[7] = 4000;
  const ExpertSplit split = splitLayer(costs, tokens, {});
  EXPECT_EQ(split.streamed, std::vector<int64_t>{7});
  EXPECT_EQ(split.cpu.size(), 15u);
  EXPECT_EQ(split.cpu_ms, 0);
  const std::vector<int64_t> negative = {1, -1};
  EXPECT_THROW(splitLayer(costs, negative, {}), Error);
}

TEST(ExpertSplit, TheEngineCallsFixedCostIsPaidOnceWhenTheCpuKeepsWork) {
  LayerCosts costs = h200Like();
  costs.cpu_call_ms = 0.7;
  const std::vector<int64_t> tokens = skewed(8);
  costs.has_gpu = false;
  const ExpertSplit all_cpu = splitLayer(costs, tokens, {});
  std::vector<int64_t> all(8);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_NEAR(all_cpu.cpu_ms, cpuSum(costs, tokens, all) + 0.7, 1e-9);
  const std::vector<int64_t> none(8, 0);
  EXPECT_EQ(splitLayer(costs, none, {}).cpu_ms, 0);  // no tokens: no call
}

}  // namespace
}  // namespace tandem::placement
