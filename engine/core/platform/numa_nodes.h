#pragma once
// The OS's NUMA nodes: which exist, their memory and their CPUs. Linux: libnuma. Windows:
// GetNumaHighestNodeNumber, GetNumaAvailableMemoryNodeEx, GetNumaNodeProcessorMaskEx.
// engine/core/numa.h builds the topology the engine uses from these.

#include <cstdint>
#include <vector>

namespace tandem::platform {

// False: the OS has no NUMA interface here; the other calls are then not to be used.
bool numaSupported();

// The highest node id (ids may have gaps); 0 on a one-node machine.
int numaHighestNodeId();

// Whether node `node_id` exists (ids up to numaHighestNodeId() may be missing).
bool numaNodeExists(int node_id);

struct NumaNodeMemoryBytes {
  uint64_t total_bytes = 0;  // 0 when the OS does not say (Windows reports only free memory)
  uint64_t free_bytes = 0;
};
NumaNodeMemoryBytes numaNodeMemoryBytes(int node_id);

// The logical CPU ids of node `node_id`, ascending.
std::vector<int> numaNodeCpuIds(int node_id);

}  // namespace tandem::platform
