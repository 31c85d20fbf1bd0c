#include <numa.h>

#include <memory>

#include "engine/core/platform/numa_nodes.h"

namespace tandem::platform {

bool numaSupported() { return numa_available() >= 0; }

int numaHighestNodeId() { return numa_max_node(); }

bool numaNodeExists(int node_id) { return numa_bitmask_isbitset(numa_all_nodes_ptr, node_id); }

NumaNodeMemoryBytes numaNodeMemoryBytes(int node_id) {
  NumaNodeMemoryBytes m;
  long long free_bytes = 0;
  const long long total = numa_node_size64(node_id, &free_bytes);
  m.total_bytes = total > 0 ? static_cast<uint64_t>(total) : 0;
  m.free_bytes = free_bytes > 0 ? static_cast<uint64_t>(free_bytes) : 0;
  return m;
}

std::vector<int> numaNodeCpuIds(int node_id) {
  std::vector<int> cpus;
  std::unique_ptr<bitmask, decltype(&numa_free_cpumask)> mask(numa_allocate_cpumask(),
                                                              &numa_free_cpumask);
  numa_bitmask_clearall(mask.get());
  if (numa_node_to_cpus(node_id, mask.get()) != 0) return cpus;
  for (unsigned cpu = 0; cpu < mask->size; ++cpu) {
    if (numa_bitmask_isbitset(mask.get(), cpu)) cpus.push_back(static_cast<int>(cpu));
  }
  return cpus;
}

}  // namespace tandem::platform
