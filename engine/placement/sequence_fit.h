#pragma once
// The longest sequence that fits (issue 29): the planner's bytes as a function of cutoff_len for a
// placement, and the largest cutoff_len whose predicted GPU and host peaks fit the machine, found
// in power-of-two steps and then refined to a multiple of kSequenceStep. `tandem plan`, the
// studio's training page and the trainer's out-of-memory error say it (docs/placement.md, "Long
// sequences").
//
// Every term of the plan grows with the tokens (memory_model.h), so "fits" is monotone in
// cutoff_len and the search's answer is a boundary: it fits and one step more does not.

#include <cstdint>
#include <string>
#include <vector>

#include "engine/placement/hardware.h"
#include "engine/placement/memory_planner.h"

namespace tandem::placement {

inline constexpr int64_t kSequenceStep = 256;          // the search's resolution, tokens
inline constexpr int64_t kMaxPlannedCutoff = 1 << 20;  // where the search stops, tokens

struct SequenceFit {
  int64_t cutoff_len = 0;          // the request's
  uint64_t gpu_peak_bytes = 0;     // at the request's cutoff_len: the fullest GPU (0: none)
  std::string gpu_peak_device;     // "cuda:0"; empty without GPUs
  uint64_t host_bytes = 0;         // at the request's cutoff_len: every host node together
  int64_t longest_cutoff_len = 0;  // 0: not even kSequenceStep tokens fit
  bool at_ceiling = false;         // the search stopped at kMaxPlannedCutoff, still fitting
  uint64_t longest_gpu_peak_bytes = 0, longest_host_bytes = 0;  // at longest_cutoff_len
  // What lengthens it, each with the longest it gives: "offload_checkpoints: true (65536 tokens)".
  std::vector<std::string> lengthen;
};

// `plan` (planMemory's or evaluatePlacement's for `request`) re-evaluated at `cutoff_len`: the
// same modules on the same devices; resident experts the planner chose (gpu_experts auto) are
// given up first, as planning at that length would; Wᵀ in a pool and the expert forward
// recomputed when the host has no room otherwise (as planMemory decides them).
MemoryPlan planAtCutoff(const PlanRequest& request, const Hardware& hardware,
                        const MemoryPlan& plan, int64_t cutoff_len);

// The request's peaks and the longest cutoff_len that fits with `plan`'s placement; with
// `advise`, also what each lengthening setting gives (plans again with it changed).
SequenceFit longestSequenceThatFits(const PlanRequest& request, const Hardware& hardware,
                                    const MemoryPlan& plan, bool advise = true);

// One line: "cutoff_len 2048 x batch 1: GPU peak 10.2 GiB on cuda:0, host 61.0 GiB; longest
// cutoff_len that fits: 24576 tokens".
std::string sequenceFitLine(const SequenceFit& fit);

// For an out-of-memory error: "the planner's longest cutoff_len that fits this machine with these
// settings is 21760 tokens (this run: 65536); longer with offload_checkpoints: true (48640
// tokens), or ...".
std::string outOfMemoryAdvice(const SequenceFit& fit);

}  // namespace tandem::placement
