#include "engine/experts/expert_routing.h"

#include <algorithm>

namespace tandem::experts {

ExpertRouting buildRouting(const int32_t* ids, int64_t n_tokens, int top_k, int64_t num_experts) {
  ExpertRouting routing;
  routing.n_tokens = n_tokens;
  routing.top_k = top_k;
  const int64_t n_pairs = n_tokens * top_k;
  routing.offsets.assign(static_cast<size_t>(num_experts + 1), 0);
  for (int64_t slot = 0; slot < n_pairs; ++slot) ++routing.offsets[ids[slot] + 1];
  for (int64_t e = 0; e < num_experts; ++e) routing.offsets[e + 1] += routing.offsets[e];
  std::vector<int64_t> next(routing.offsets.begin(), routing.offsets.end() - 1);
  routing.slot_of_pos.resize(static_cast<size_t>(n_pairs));
  routing.pos_of_slot.resize(static_cast<size_t>(n_pairs));
  for (int64_t slot = 0; slot < n_pairs; ++slot) {
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
    for (int64_t begin = routing.offsets[e]; begin < routing.offsets[e + 1]; begin += max_rows) {
      tasks.push_back({e, begin, std::min(begin + max_rows, routing.offsets[e + 1])});
    }
  }
  return tasks;
}

}  // namespace tandem::experts
