#pragma once
// Which way each routed expert of one MoE layer goes on one call (experts_mode: auto), decided
// after routing is known: resident on the layer's device (the resident cache, chosen every
// resident_refresh_steps from the routing since the last refresh), streamed to the device on this
// call (copied on the side stream ahead of the compute, computed there by torch), or computed by
// the CPU expert engine. The two sides run at once (moe_function.h).
//
// There is one real policy: the cost model's (placement::splitLayer, expert_split_policy.h) on
// the machine's calibrated rates (placement::MachineRates: the calibration cache, measured at
// training start-up when there is none, or the machine's preset figures). The cycling policy is a
// diagnostic for the parity tests. Plain arithmetic, no libtorch.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "engine/experts/expert_types.h"
#include "engine/placement/expert_split_policy.h"
#include "engine/placement/machine_rates.h"

namespace tandem::model {

struct ExpertSplitInput {
  std::span<const int64_t> pairs_per_expert;  // [E] (token, slot) pairs routed to each expert
  std::span<const int64_t> resident;          // ids in the resident cache, ascending
  // The call builds a graph: its backward keeps the split (and streams the experts again), so it
  // is priced forward + backward; otherwise (inference, checkpointing's first forward) forward.
  bool builds_graph = true;
};

// The split's lists (placement::ExpertSplit): `resident` as given; `streamed` and `cpu` hold every
// other expert once (`cpu` also those no pair routes to); the predicted busy times per resource.
using ExpertSplit = placement::ExpertSplit;

class ExpertSplitPolicy {
 public:
  virtual ~ExpertSplitPolicy() = default;
  virtual ExpertSplit split(const ExpertSplitInput& input) = 0;
  // The resident cache's next content: `count` experts from the pairs routed since the last
  // refresh ([E]). Default: the most routed, ties to the lower id, ascending ids.
  virtual std::vector<int64_t> resident(std::span<const int64_t> pairs_since_refresh,
                                        int64_t count);
};

// placement::splitLayer on one layer's costs: the hottest non-resident experts streamed while
// that lowers the predicted finish max(CPU, GPU, copy engine), the rest on the CPU.
class CostModelSplitPolicy : public ExpertSplitPolicy {
 public:
  CostModelSplitPolicy(placement::LayerCosts forward, placement::LayerCosts forward_and_backward);
  ExpertSplit split(const ExpertSplitInput& input) override;
  const placement::LayerCosts& costs(bool builds_graph) const {
    return builds_graph ? forward_and_backward_ : forward_;
  }

 private:
  placement::LayerCosts forward_, forward_and_backward_;
};

// A diagnostic policy for tests (expert_split: cycle): on call c (counted per policy, so per
// layer) expert e goes to path (e + c) mod 3, 0 resident, 1 streamed, 2 CPU, so every expert
// takes every path in turn and every split changes from one call to the next. Its resident()
// picks the experts of path 0 at the refresh's call, whatever `count` says.
class CyclingSplitPolicy : public ExpertSplitPolicy {
 public:
  ExpertSplit split(const ExpertSplitInput& input) override;
  std::vector<int64_t> resident(std::span<const int64_t> pairs_since_refresh,
                                int64_t count) override;

 private:
  int64_t calls_ = 0;
};

enum class ExpertSplitChoice { Balance, Cycle };
// "balance" or "cycle"; anything else is an Error naming both.
ExpertSplitChoice parseExpertSplit(std::string_view text);

// The policy for one layer of `spec` whose experts are `bytes_per_expert` each as streamed, in
// `format` ("bf16", "int8": the CPU engine's rate curve) on GPU `gpu` (its rates; the CPU device
// of the tests takes the first GPU's).
std::unique_ptr<ExpertSplitPolicy> makeExpertSplitPolicy(ExpertSplitChoice choice,
                                                         const placement::MachineRates& rates,
                                                         const experts::ExpertLayerSpec& spec,
                                                         double bytes_per_expert,
                                                         std::string_view format, int gpu);

// The rates auto mode splits by when the caller gave none: this machine's cached calibration is
// the caller's to read (engine/train does at start-up); here, the figures of its hardware preset
// (placement::presetRates of the probed machine).
placement::MachineRates defaultSplitRates();

}  // namespace tandem::model
