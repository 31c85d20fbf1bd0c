#include "engine/model/expert_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "engine/core/error.h"

namespace tandem::model {
namespace {

struct Layer {
  std::vector<int64_t> pairs;
  std::unique_ptr<bool[]> resident;
  ExpertSplitCosts costs;

  Layer(std::vector<int64_t> p, const std::vector<int64_t>& resident_ids, ExpertSplitCosts c)
      : pairs(std::move(p)), resident(std::make_unique<bool[]>(pairs.size())), costs(c) {
    for (int64_t e : resident_ids) resident[static_cast<size_t>(e)] = true;
  }
  ExpertSplitInput input() const {
    return {pairs, std::span<const bool>(resident.get(), pairs.size()), costs};
  }
};

// The slower side of streaming the k hottest non-resident experts, written out from the model's
// definition: device = max(copies, resident compute) + streamed compute; CPU = its pairs and
// experts.
double slowerSide(const Layer& l, const std::vector<int64_t>& hot_first, size_t k) {
  double resident_pairs = 0, streamed_pairs = 0, cpu_pairs = 0;
  for (size_t e = 0; e < l.pairs.size(); ++e) {
    if (l.resident[e]) resident_pairs += static_cast<double>(l.pairs[e]);
  }
  for (size_t i = 0; i < hot_first.size(); ++i) {
    (i < k ? streamed_pairs : cpu_pairs) += static_cast<double>(l.pairs[hot_first[i]]);
  }
  const double device = std::max(l.costs.copy_per_expert * static_cast<double>(k),
                                 l.costs.gpu_per_pair * resident_pairs) +
                        l.costs.gpu_per_pair * streamed_pairs;
  const double cpu = l.costs.cpu_per_pair * cpu_pairs +
                     l.costs.cpu_per_expert * static_cast<double>(hot_first.size() - k);
  return std::max(device, cpu);
}

// The balancing policy streams the prefix of the hottest non-resident experts whose slower side
// is the smallest (the device side grows with the prefix, the CPU side shrinks: the first
// prefix that does not improve is the best one), and leaves resident and idle experts out.
TEST(BalancedSplitPolicy, StreamsTheHottestUntilTheSidesMeet) {
  const std::vector<int64_t> pairs{40, 0, 3, 25, 7, 90, 12, 1, 55, 0, 18, 4};
  const std::vector<int64_t> resident{5, 8};
  for (const ExpertSplitCosts costs :
       {ExpertSplitCosts{1.0, 2.0, 0.05, 4.0}, ExpertSplitCosts{1.0, 0.0, 0.2, 1.0},
        ExpertSplitCosts{0.3, 5.0, 0.01, 20.0}, ExpertSplitCosts{1.0, 1.0, 0.1, 0.5}}) {
    SCOPED_TRACE(costs.copy_per_expert);
    const Layer layer(pairs, resident, costs);
    std::vector<int64_t> hot_first;
    for (size_t e = 0; e < pairs.size(); ++e) {
      if (!layer.resident[e] && pairs[e] > 0) hot_first.push_back(static_cast<int64_t>(e));
    }
    std::stable_sort(hot_first.begin(), hot_first.end(),
                     [&](int64_t a, int64_t b) { return pairs[a] > pairs[b]; });
    size_t best_k = 0;
    for (size_t k = 1; k <= hot_first.size(); ++k) {
      if (slowerSide(layer, hot_first, k) < slowerSide(layer, hot_first, best_k)) best_k = k;
    }
    BalancedSplitPolicy policy;
    const ExpertSplit split = policy.split(layer.input());
    std::vector<int64_t> want_streamed(hot_first.begin(), hot_first.begin() + best_k);
    std::vector<int64_t> want_cpu(hot_first.begin() + best_k, hot_first.end());
    std::sort(want_streamed.begin(), want_streamed.end());
    std::sort(want_cpu.begin(), want_cpu.end());
    EXPECT_EQ(split.streamed, want_streamed);
    EXPECT_EQ(split.cpu, want_cpu);
    const BalancedSplitPolicy::Sides sides = BalancedSplitPolicy::predict(layer.input(), split);
    EXPECT_DOUBLE_EQ(std::max(sides.device, sides.cpu), slowerSide(layer, hot_first, best_k));
  }
}

TEST(BalancedSplitPolicy, ExtremeRatesSendEverythingOneWay) {
  const std::vector<int64_t> pairs{5, 9, 0, 2};
  const Layer free_device(pairs, {1}, ExpertSplitCosts{1.0, 1.0, 0.0, 0.0});
  BalancedSplitPolicy policy;
  ExpertSplit split = policy.split(free_device.input());
  EXPECT_EQ(split.streamed, (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(split.cpu.empty());
  const Layer no_link(pairs, {1}, ExpertSplitCosts{1.0, 1.0, 0.0, 1e9});
  split = policy.split(no_link.input());
  EXPECT_TRUE(split.streamed.empty());
  EXPECT_EQ(split.cpu, (std::vector<int64_t>{0, 3}));
}

TEST(ExpertSplitPolicy, TheResidentCacheIsTheMostRouted) {
  BalancedSplitPolicy policy;
  const std::vector<int64_t> pairs{3, 9, 9, 0, 12, 1};
  EXPECT_EQ(policy.resident(pairs, 2), (std::vector<int64_t>{1, 4}));  // ties: lower id
  EXPECT_EQ(policy.resident(pairs, 3), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(policy.resident(pairs, 0), std::vector<int64_t>{});
  EXPECT_EQ(policy.resident(pairs, 99).size(), pairs.size());
}

// Over three calls every expert with pairs takes each path: resident (the cache the policy
// picks for that call), streamed, CPU.
TEST(CyclingSplitPolicy, EveryExpertTakesEveryPath) {
  CyclingSplitPolicy policy;
  const std::vector<int64_t> pairs{1, 2, 3, 4, 5, 6, 7};
  std::vector<std::vector<int>> paths(pairs.size());  // per expert: 0 resident, 1 streamed, 2 CPU
  for (int call = 0; call < 3; ++call) {
    const std::vector<int64_t> resident = policy.resident(pairs, 2);
    const Layer layer(pairs, resident, {});
    const ExpertSplit split = policy.split(layer.input());
    for (int64_t e : resident) paths[static_cast<size_t>(e)].push_back(0);
    for (int64_t e : split.streamed) paths[static_cast<size_t>(e)].push_back(1);
    for (int64_t e : split.cpu) paths[static_cast<size_t>(e)].push_back(2);
  }
  for (auto& p : paths) {
    std::sort(p.begin(), p.end());
    EXPECT_EQ(p, (std::vector<int>{0, 1, 2}));
  }
}

// A Qwen3-30B-A3B layer (H 2048, I 768, bf16: 9.4 MB an expert) on the default rates.
TEST(ExpertSplitCosts, FollowFromTheRates) {
  const experts::ExpertLayerSpec spec{128, 2048, 768};
  const double bytes = 3.0 * 2048 * 768 * 2;
  ExpertSplitRates rates;
  rates.cpu_flops = 1e12;
  rates.cpu_weight_bytes_per_s = 1e11;
  rates.gpu_flops = 1e14;
  rates.link_bytes_per_s = 5e10;
  const ExpertSplitCosts c = expertSplitCosts(spec, bytes, rates);
  const double forward_flops = 6.0 * 2048 * 768;
  EXPECT_DOUBLE_EQ(c.cpu_per_pair, 3 * forward_flops / 1e12);
  EXPECT_DOUBLE_EQ(c.gpu_per_pair, 4 * forward_flops / 1e14);
  EXPECT_DOUBLE_EQ(c.copy_per_expert, 2 * bytes / 5e10);
  EXPECT_DOUBLE_EQ(c.cpu_per_expert, 2 * bytes / 1e11);
}

TEST(ExpertSplitChoice, ParsesItsNames) {
  EXPECT_EQ(parseExpertSplit("balance"), ExpertSplitChoice::Balance);
  EXPECT_EQ(parseExpertSplit("cycle"), ExpertSplitChoice::Cycle);
  EXPECT_THROW(parseExpertSplit("greedy"), Error);
  EXPECT_NE(
      dynamic_cast<CyclingSplitPolicy*>(makeExpertSplitPolicy(ExpertSplitChoice::Cycle).get()),
      nullptr);
}

}  // namespace
}  // namespace tandem::model
