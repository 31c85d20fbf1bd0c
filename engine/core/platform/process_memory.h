#pragma once
// Where this process's memory lives, as the OS tells it. Linux: /proc/self/numa_maps (pages per
// NUMA node of every mapping) and /sys/devices/system/node/nodeN/meminfo. Windows: not known
// (empty text, 0 bytes), so the memory map shows no per-node process share there.

#include <cstdint>
#include <string>

namespace tandem::platform {

// The text of /proc/self/numa_maps; empty when the OS has none (no NUMA support, Windows).
std::string processNumaMapsText();

// Page cache and reclaimable slab on node `node_id` (Inactive(file) + SReclaimable of the node's
// meminfo): what the kernel gives back on demand there, beside the node's free pages.
uint64_t numaNodeReclaimableBytes(int node_id);

}  // namespace tandem::platform
