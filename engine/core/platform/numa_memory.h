#pragma once
// Page-aligned memory placed on one NUMA node. Linux: numa_alloc_onnode / numa_free. Windows:
// VirtualAllocExNuma / VirtualFree.

#include <cstddef>

namespace tandem::platform {

// `bytes` (> 0) on node `node_id`, page-aligned; nullptr when the OS cannot (no NUMA, no such
// node, no memory): the caller then allocates ordinary memory.
void* allocateOnNumaNode(size_t bytes, int node_id);

// Frees what allocateOnNumaNode returned; `bytes` is the size it was asked for.
void freeOnNumaNode(void* data, size_t bytes);

}  // namespace tandem::platform
