#pragma once
// Groups the routed (token, slot) pairs of one MoE call by expert: a stable counting sort, so
// each expert's rows are contiguous and experts with no tokens cost nothing.

#include <cstdint>
#include <vector>

namespace tandem::experts {

// A topk id of kMaskedSlot means "not computed here": another device computes that (token,
// expert) pair (GPU-resident experts, engine/gpu/resident_experts.h). It has no sorted position,
// adds nothing to the token's output, and its routing-weight gradient is 0.
inline constexpr int32_t kMaskedSlot = -1;

struct ExpertRouting {
  int64_t n_tokens = 0;
  int top_k = 0;
  // offsets [E + 1]: expert e owns sorted positions [offsets[e], offsets[e + 1]).
  std::vector<int64_t> offsets;
  // slot_of_pos [P]: the pair (t · top_k + j) at sorted position pos (P = the computed pairs:
  // n_tokens · top_k less the masked slots).
  std::vector<int64_t> slot_of_pos;
  // pos_of_slot [n_tokens · top_k]: the inverse (kMaskedSlot for a masked slot), used by the
  // per-token reductions.
  std::vector<int64_t> pos_of_slot;

  int64_t pairs() const { return static_cast<int64_t>(slot_of_pos.size()); }
  int64_t rows(int64_t expert) const { return offsets[expert + 1] - offsets[expert]; }
  int64_t tokenOf(int64_t pos) const { return slot_of_pos[pos] / top_k; }
};

// ids [n_tokens, top_k] int32, each in [0, num_experts) or kMaskedSlot (validated by the caller).
ExpertRouting buildRouting(const int32_t* ids, int64_t n_tokens, int top_k, int64_t num_experts);

// A unit of parallel work: sorted positions [begin, end) of one expert.
struct ExpertTask {
  int64_t expert = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// Cuts every non-empty expert into row blocks of at most max_rows, so one hot expert becomes
// many tasks that idle workers can steal.
std::vector<ExpertTask> cutIntoTasks(const ExpertRouting& routing, int64_t max_rows);

}  // namespace tandem::experts
