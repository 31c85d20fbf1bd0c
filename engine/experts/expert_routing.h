#pragma once
// Groups the routed (token, slot) pairs of one MoE call by expert: a stable counting sort, so
// each expert's rows are contiguous and experts with no tokens cost nothing.

#include <cstdint>
#include <vector>

namespace tandem::experts {

// A topk id of kMaskedSlot means "not computed here": another device computes that (token,
// expert) pair (GPU-resident experts, engine/model/resident_experts.h). It has no sorted position,
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

// The column split (ExpertLayerOptions::task_split, docs/experts.md "Scheduling"). A task's cost
// is modelled as (rows + kStreamRows) per output column: kStreamRows rows of arithmetic cost
// about what streaming the task's slice of weights does (a bf16 weight column feeds 2·rows
// FLOPs per 2 bytes read; CPUs do ~10-20 FLOPs per byte of DRAM bandwidth).
inline constexpr int64_t kStreamRows = 16;

// True when the row-block tasks load `threads` badly: the longest one alone costs more than half
// of one thread's fair share of the total (fewer tasks than threads always is). Largest-first
// scheduling then finishes at most 1.5 fair shares in; beyond that the longest task is the step.
bool rowTasksUnbalanced(const std::vector<ExpertTask>& tasks, int threads);

// Columns [col_begin, col_end) of row-block task `row_task` (an index into the row tasks).
struct ColumnTask {
  int64_t row_task = 0;
  int64_t col_begin = 0;
  int64_t col_end = 0;
};

// Cuts each row-block task's `columns` output columns into blocks (multiples of `block` except
// the last), more blocks for costlier tasks, about 4 · threads tasks in all; costliest first.
std::vector<ColumnTask> cutIntoColumnTasks(const std::vector<ExpertTask>& tasks, int64_t columns,
                                           int64_t block, int threads);

}  // namespace tandem::experts
