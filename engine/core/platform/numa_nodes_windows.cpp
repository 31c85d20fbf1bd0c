#include <windows.h>

#include <algorithm>
#include <cstdint>

#include "engine/core/platform/numa_nodes.h"

namespace tandem::platform {

// A one-node machine counts as "no NUMA": numa.h then takes the whole machine's figures, which
// Windows knows exactly, instead of per-node ones it can only estimate (below).
bool numaSupported() {
  ULONG highest = 0;
  return GetNumaHighestNodeNumber(&highest) != 0 && highest > 0;
}

int numaHighestNodeId() {
  ULONG highest = 0;
  return GetNumaHighestNodeNumber(&highest) ? static_cast<int>(highest) : 0;
}

bool numaNodeExists(int node_id) {
  GROUP_AFFINITY affinity = {};
  ULONGLONG free_bytes = 0;
  const auto node = static_cast<USHORT>(node_id);
  return GetNumaNodeProcessorMaskEx(node, &affinity) != 0 ||
         GetNumaAvailableMemoryNodeEx(node, &free_bytes) != 0;
}

// Windows reports a node's available memory but not its size: the size is estimated as an equal
// share of the machine's RAM among the nodes that have memory (server boards populate nodes alike).
NumaNodeMemoryBytes numaNodeMemoryBytes(int node_id) {
  NumaNodeMemoryBytes m;
  ULONGLONG free_bytes = 0;
  if (!GetNumaAvailableMemoryNodeEx(static_cast<USHORT>(node_id), &free_bytes)) return m;
  m.free_bytes = free_bytes;
  int nodes_with_memory = 0;
  for (int id = 0; id <= numaHighestNodeId(); ++id) {
    ULONGLONG node_free = 0;
    if (GetNumaAvailableMemoryNodeEx(static_cast<USHORT>(id), &node_free) && node_free > 0) {
      ++nodes_with_memory;
    }
  }
  MEMORYSTATUSEX status = {};
  status.dwLength = sizeof status;
  if (nodes_with_memory > 0 && GlobalMemoryStatusEx(&status)) {
    m.total_bytes = std::max<uint64_t>(free_bytes, status.ullTotalPhys / nodes_with_memory);
  }
  return m;
}

// CPUs of the node's processor group, numbered as cpu_affinity.h numbers them (group 0 only).
std::vector<int> numaNodeCpuIds(int node_id) {
  std::vector<int> cpus;
  GROUP_AFFINITY affinity = {};
  if (!GetNumaNodeProcessorMaskEx(static_cast<USHORT>(node_id), &affinity) || affinity.Group != 0) {
    return cpus;
  }
  for (int cpu = 0; cpu < static_cast<int>(8 * sizeof(KAFFINITY)); ++cpu) {
    if ((affinity.Mask >> cpu) & 1u) cpus.push_back(cpu);
  }
  return cpus;
}

}  // namespace tandem::platform
