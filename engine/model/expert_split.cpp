#include "engine/model/expert_split.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "engine/core/error.h"
#include "engine/model/machine_probe.h"

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

CostModelSplitPolicy::CostModelSplitPolicy(placement::LayerCosts forward,
                                           placement::LayerCosts forward_and_backward)
    : forward_(std::move(forward)), forward_and_backward_(std::move(forward_and_backward)) {}

ExpertSplit CostModelSplitPolicy::split(const ExpertSplitInput& input) {
  const placement::LayerCosts& c = costs(input.builds_graph);
  if (c.has_gpu || input.resident.empty())
    return placement::splitLayer(c, input.pairs_per_expert, input.resident);
  // Rates without this device's terms (a GPU the presets do not know, not calibrated): nothing is
  // streamed, the resident experts still run where their weights are (their CPU time, which the
  // prediction then counts, is an over-estimate).
  ExpertSplit split = placement::splitLayer(c, input.pairs_per_expert, {});
  std::erase_if(split.cpu, [&](int64_t e) {
    return std::binary_search(input.resident.begin(), input.resident.end(), e);
  });
  split.resident.assign(input.resident.begin(), input.resident.end());
  return split;
}

ExpertSplit CyclingSplitPolicy::split(const ExpertSplitInput& input) {
  const int64_t call = calls_++;
  ExpertSplit split;
  split.resident.assign(input.resident.begin(), input.resident.end());
  std::vector<char> is_resident(input.pairs_per_expert.size(), 0);
  for (const int64_t e : input.resident) is_resident[static_cast<size_t>(e)] = 1;
  for (size_t e = 0; e < input.pairs_per_expert.size(); ++e) {
    if (is_resident[e]) continue;
    // Path 0 (resident) of an expert the cache does not hold: the CPU, so every path still runs.
    const int64_t path = (static_cast<int64_t>(e) + call) % 3;
    const bool streamed = path == 1 && input.pairs_per_expert[e] > 0;
    (streamed ? split.streamed : split.cpu).push_back(static_cast<int64_t>(e));
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

ExpertSplitChoice parseExpertSplit(std::string_view text) {
  if (text == "balance") return ExpertSplitChoice::Balance;
  if (text == "cycle") return ExpertSplitChoice::Cycle;
  throw Error("expert_split must be balance or cycle, got '" + std::string(text) + "'",
              "use balance (the default) or cycle (a diagnostic that sends every expert through "
              "every path in turn)");
}

std::unique_ptr<ExpertSplitPolicy> makeExpertSplitPolicy(ExpertSplitChoice choice,
                                                         const placement::MachineRates& rates,
                                                         const experts::ExpertLayerSpec& spec,
                                                         double bytes_per_expert,
                                                         std::string_view format, int gpu) {
  if (choice == ExpertSplitChoice::Cycle) return std::make_unique<CyclingSplitPolicy>();
  const placement::ExpertCostShape shape{spec.hidden, spec.intermediate, bytes_per_expert,
                                         std::string(format), gpu};
  return std::make_unique<CostModelSplitPolicy>(
      placement::expertLayerCosts(rates, shape, placement::LayerPass::Forward),
      placement::expertLayerCosts(rates, shape, placement::LayerPass::ForwardAndBackward));
}

placement::MachineRates defaultSplitRates() {
  return placement::presetRates(probeMachine());  // with its GPUs (torch's view of them)
}

}  // namespace tandem::model
