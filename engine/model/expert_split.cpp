#include "engine/model/expert_split.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "engine/core/error.h"

namespace tandem::model {

std::vector<int64_t> ExpertSplitPolicy::resident(std::span<const int64_t> pairs_since_refresh,
                                                 int64_t count) {
  std::vector<int64_t> order(pairs_since_refresh.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return pairs_since_refresh[static_cast<size_t>(a)] >
           pairs_since_refresh[static_cast<size_t>(b)];
  });
  order.resize(static_cast<size_t>(std::clamp<int64_t>(count, 0, std::ssize(order))));
  std::sort(order.begin(), order.end());
  return order;
}

BalancedSplitPolicy::Sides BalancedSplitPolicy::predict(const ExpertSplitInput& input,
                                                        const ExpertSplit& split) {
  const ExpertSplitCosts& c = input.costs;
  int64_t resident_pairs = 0;
  for (size_t e = 0; e < input.pairs_per_expert.size(); ++e) {
    if (input.resident[e]) resident_pairs += input.pairs_per_expert[e];
  }
  int64_t streamed_pairs = 0, cpu_pairs = 0;
  for (int64_t e : split.streamed) streamed_pairs += input.pairs_per_expert[static_cast<size_t>(e)];
  for (int64_t e : split.cpu) cpu_pairs += input.pairs_per_expert[static_cast<size_t>(e)];
  Sides sides;
  const double copies = c.copy_per_expert * static_cast<double>(split.streamed.size());
  // The streamed experts compute after their copies landed; the resident ones meanwhile.
  sides.device = std::max(copies, c.gpu_per_pair * static_cast<double>(resident_pairs)) +
                 c.gpu_per_pair * static_cast<double>(streamed_pairs);
  sides.cpu = c.cpu_per_pair * static_cast<double>(cpu_pairs) +
              c.cpu_per_expert * static_cast<double>(split.cpu.size());
  return sides;
}

ExpertSplit BalancedSplitPolicy::split(const ExpertSplitInput& input) {
  std::vector<int64_t> candidates;  // non-resident experts with pairs, hottest first
  for (size_t e = 0; e < input.pairs_per_expert.size(); ++e) {
    if (!input.resident[e] && input.pairs_per_expert[e] > 0)
      candidates.push_back(static_cast<int64_t>(e));
  }
  std::stable_sort(candidates.begin(), candidates.end(), [&](int64_t a, int64_t b) {
    return input.pairs_per_expert[static_cast<size_t>(a)] >
           input.pairs_per_expert[static_cast<size_t>(b)];
  });
  ExpertSplit split{{}, candidates};
  auto slower = [&](const ExpertSplit& s) {
    const Sides sides = predict(input, s);
    return std::max(sides.device, sides.cpu);
  };
  double best = slower(split);
  size_t streamed = 0;
  for (; streamed < candidates.size(); ++streamed) {
    ExpertSplit next{{candidates.begin(), candidates.begin() + static_cast<int64_t>(streamed) + 1},
                     {candidates.begin() + static_cast<int64_t>(streamed) + 1, candidates.end()}};
    const double time = slower(next);
    if (time >= best) break;
    best = time;
    split = std::move(next);
  }
  std::sort(split.streamed.begin(), split.streamed.end());
  std::sort(split.cpu.begin(), split.cpu.end());
  return split;
}

ExpertSplit CyclingSplitPolicy::split(const ExpertSplitInput& input) {
  const int64_t call = calls_++;
  ExpertSplit split;
  for (size_t e = 0; e < input.pairs_per_expert.size(); ++e) {
    if (input.resident[e] || input.pairs_per_expert[e] == 0) continue;
    // Path 0 (resident) of an expert the cache does not hold: the CPU, so every path still runs.
    const int64_t path = (static_cast<int64_t>(e) + call) % 3;
    (path == 1 ? split.streamed : split.cpu).push_back(static_cast<int64_t>(e));
  }
  return split;
}

std::vector<int64_t> CyclingSplitPolicy::resident(std::span<const int64_t> pairs_since_refresh,
                                                  int64_t /*count*/) {
  std::vector<int64_t> experts;
  for (size_t e = 0; e < pairs_since_refresh.size(); ++e) {
    if ((static_cast<int64_t>(e) + calls_) % 3 == 0) experts.push_back(static_cast<int64_t>(e));
  }
  return experts;
}

ExpertSplitCosts expertSplitCosts(const experts::ExpertLayerSpec& spec, double bytes_per_expert,
                                  const ExpertSplitRates& rates) {
  const double forward_flops =
      3.0 * 2.0 * static_cast<double>(spec.hidden) * static_cast<double>(spec.intermediate);
  ExpertSplitCosts c;
  c.cpu_per_pair = 3.0 * forward_flops / rates.cpu_flops;  // forward, backward (2x)
  // The engine reads the frozen weights once in forward and once (Wᵀ) in backward.
  c.cpu_per_expert = 2.0 * bytes_per_expert / rates.cpu_weight_bytes_per_s;
  c.gpu_per_pair = 4.0 * forward_flops / rates.gpu_flops;  // forward, recompute, backward (2x)
  c.copy_per_expert = 2.0 * bytes_per_expert / rates.link_bytes_per_s;
  return c;
}

ExpertSplitChoice parseExpertSplit(std::string_view text) {
  if (text == "balance") return ExpertSplitChoice::Balance;
  if (text == "cycle") return ExpertSplitChoice::Cycle;
  throw Error("expert_split must be balance or cycle, got '" + std::string(text) + "'",
              "use balance (the default) or cycle (a diagnostic that sends every expert through "
              "every path in turn)");
}

std::unique_ptr<ExpertSplitPolicy> makeExpertSplitPolicy(ExpertSplitChoice choice) {
  if (choice == ExpertSplitChoice::Cycle) return std::make_unique<CyclingSplitPolicy>();
  return std::make_unique<BalancedSplitPolicy>();
}

}  // namespace tandem::model
