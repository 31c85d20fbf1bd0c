#include "engine/experts/expert_routing.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace tandem::experts {

ExpertRouting buildRouting(const int32_t* ids, int64_t n_tokens, int top_k, int64_t num_experts) {
  ExpertRouting routing;
  routing.n_tokens = n_tokens;
  routing.top_k = top_k;
  const int64_t n_slots = n_tokens * top_k;
  routing.offsets.assign(static_cast<size_t>(num_experts + 1), 0);
  for (int64_t slot = 0; slot < n_slots; ++slot) {
    if (ids[slot] != kMaskedSlot) ++routing.offsets[ids[slot] + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) routing.offsets[e + 1] += routing.offsets[e];
  std::vector<int64_t> next(routing.offsets.begin(), routing.offsets.end() - 1);
  routing.slot_of_pos.resize(static_cast<size_t>(routing.offsets[num_experts]));
  routing.pos_of_slot.assign(static_cast<size_t>(n_slots), kMaskedSlot);
  for (int64_t slot = 0; slot < n_slots; ++slot) {
    if (ids[slot] == kMaskedSlot) continue;
    const int64_t pos = next[ids[slot]]++;
    routing.slot_of_pos[pos] = slot;
    routing.pos_of_slot[slot] = pos;
  }
  return routing;
}

std::vector<ExpertTask> cutIntoTasks(const ExpertRouting& routing, int64_t max_rows) {
  std::vector<ExpertTask> tasks;
  const auto n_experts = static_cast<int64_t>(routing.offsets.size()) - 1;
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t rows = routing.rows(e);
    if (rows == 0) continue;
    // Near-equal blocks (130 rows → 80 + 50, not 128 + 2), rounded to 16 rows (an AMX tile).
    const int64_t blocks = (rows + max_rows - 1) / max_rows;
    const int64_t size = std::min(max_rows, ((rows + blocks - 1) / blocks + 15) / 16 * 16);
    for (int64_t begin = routing.offsets[e]; begin < routing.offsets[e + 1]; begin += size) {
      tasks.push_back({e, begin, std::min(begin + size, routing.offsets[e + 1])});
    }
  }
  // Largest first: the pool hands them out roughly in order, so a hot expert's blocks start
  // early and the small ones fill the gaps at the end (longest-processing-time-first).
  std::stable_sort(tasks.begin(), tasks.end(), [](const ExpertTask& a, const ExpertTask& b) {
    return a.end - a.begin > b.end - b.begin;
  });
  return tasks;
}

namespace {
double taskCost(const ExpertTask& task) {
  return static_cast<double>(task.end - task.begin + kStreamRows);
}
}  // namespace

bool rowTasksUnbalanced(const std::vector<ExpertTask>& tasks, int threads) {
  if (tasks.empty() || threads <= 1) return false;
  double total = 0, longest = 0;
  for (const ExpertTask& task : tasks) {
    total += taskCost(task);
    longest = std::max(longest, taskCost(task));
  }
  return longest > 0.5 * total / threads;
}

std::vector<ColumnTask> cutIntoColumnTasks(const std::vector<ExpertTask>& tasks, int64_t columns,
                                           int64_t block, int threads) {
  constexpr int kTasksPerThread = 4;
  double total = 0;
  for (const ExpertTask& task : tasks) total += taskCost(task);
  const double unit = total / (kTasksPerThread * std::max(threads, 1));
  const int64_t max_blocks = (columns + block - 1) / block;
  std::vector<std::pair<double, ColumnTask>> pieces;  // (cost, task)
  for (size_t i = 0; i < tasks.size(); ++i) {
    const double c = taskCost(tasks[i]);
    const auto wanted = static_cast<int64_t>(std::ceil(c / unit));
    const int64_t blocks = std::clamp<int64_t>(wanted, 1, max_blocks);
    const int64_t width = ((columns + blocks - 1) / blocks + block - 1) / block * block;
    for (int64_t col = 0; col < columns; col += width) {
      const int64_t end = std::min(columns, col + width);
      pieces.push_back({c * static_cast<double>(end - col), {static_cast<int64_t>(i), col, end}});
    }
  }
  // Costliest first, as cutIntoTasks orders the row tasks (longest-processing-time-first).
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<ColumnTask> out;
  out.reserve(pieces.size());
  for (const auto& piece : pieces) out.push_back(piece.second);
  return out;
}

}  // namespace tandem::experts
