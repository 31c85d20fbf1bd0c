#include "engine/experts/expert_routing.h"

#include <algorithm>

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

}  // namespace tandem::experts
