#pragma once
// Which way each routed expert of one MoE layer goes this step (experts_mode: auto), decided
// after routing is known: resident on the layer's device (the resident cache, chosen every
// resident_refresh_steps from the routing since the last refresh), streamed to the device this
// step (copied on the side stream ahead of the compute, computed there by torch), or computed by
// the CPU expert engine. The two sides run at once (moe_function.h), so the step's MoE time is
// about the slower side's: a policy balances them.
//
// Plain arithmetic, no libtorch: the policy is an interface so that a calibrated cost model
// (engine/placement) can replace the simple balancing one; the rates are inputs.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "engine/experts/expert_types.h"

namespace tandem::model {

// What one pair or one expert costs a training step (its forward and backward), in seconds.
struct ExpertSplitCosts {
  double cpu_per_pair = 0;     // the CPU engine's forward + backward of one (token, expert) pair
  double cpu_per_expert = 0;   // the CPU engine's fixed cost of an expert with pairs (its weights
                               // read from RAM, forward and backward)
  double gpu_per_pair = 0;     // the device's forward + recomputed forward + backward of a pair
  double copy_per_expert = 0;  // host -> device copies of one expert's weights (forward and
                               // backward each stream it)
};

struct ExpertSplitInput {
  std::span<const int64_t> pairs_per_expert;  // [E] (token, slot) pairs routed to each expert
  std::span<const bool> resident;             // [E] true: the expert is in the resident cache
  ExpertSplitCosts costs;
};

// The non-resident experts with pairs, each in exactly one list, ascending ids. (The resident
// experts' pairs always run on the device: their weights are there already.)
struct ExpertSplit {
  std::vector<int64_t> streamed, cpu;
};

class ExpertSplitPolicy {
 public:
  virtual ~ExpertSplitPolicy() = default;
  virtual ExpertSplit split(const ExpertSplitInput& input) = 0;
  // The resident cache's next content: `count` experts from the pairs routed since the last
  // refresh ([E]). Default: the most routed, ties to the lower id, ascending ids.
  virtual std::vector<int64_t> resident(std::span<const int64_t> pairs_since_refresh,
                                        int64_t count);
};

// The hottest non-resident experts are streamed, one at a time, while that lowers the predicted
// time of the slower side: the device's (resident and streamed pairs, after the streamed copies
// it waits for) against the CPU engine's (its pairs and experts). The copy engine and the device
// overlap except for the copy of the first streamed expert, which the model charges in full
// (conservative: the resident experts' compute usually hides it).
class BalancedSplitPolicy : public ExpertSplitPolicy {
 public:
  ExpertSplit split(const ExpertSplitInput& input) override;
  // Predicted seconds of each side for a split (exposed for tests and the bench's trace).
  struct Sides {
    double device = 0, cpu = 0;
  };
  static Sides predict(const ExpertSplitInput& input, const ExpertSplit& split);
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

// Device-independent rates from which the costs of a layer follow (the costmodel's calibration
// replaces the defaults: measured on the H200 machine, ENVIRONMENT.md, rounded down for small
// per-expert batches).
struct ExpertSplitRates {
  double cpu_flops = 1.0e12;             // the CPU engine's expert GEMMs, flop/s
  double cpu_weight_bytes_per_s = 4e10;  // its reads of an expert's weights, bytes/s
  double gpu_flops = 1.5e14;             // the device's expert GEMMs, flop/s
  double link_bytes_per_s = 4.0e10;      // pinned host -> device copies, bytes/s
};

// The costs of one layer of `spec` whose experts are `bytes_per_expert` (as streamed) on the
// device: a pair's forward is 3 products of 2·H·I flops; the CPU's backward is twice that (dX
// and the LoRA grads), the device's backward recomputes the forward first.
ExpertSplitCosts expertSplitCosts(const experts::ExpertLayerSpec& spec, double bytes_per_expert,
                                  const ExpertSplitRates& rates);

enum class ExpertSplitChoice { Balance, Cycle };
// "balance" or "cycle"; anything else is an Error naming both.
ExpertSplitChoice parseExpertSplit(std::string_view text);
std::unique_ptr<ExpertSplitPolicy> makeExpertSplitPolicy(ExpertSplitChoice choice);

}  // namespace tandem::model
