#pragma once
// Host memory per NUMA node as the OS sees it now: the node's size, what it can still hand out,
// and how much of it this process holds. The memory map's node columns put the engine's ledger
// beside these figures: "free" is the OS's, never capacity minus ledger.

#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

namespace tandem {

struct HostNodeMemory {
  int node = 0;
  uint64_t total_bytes = 0;
  // Free pages plus what the kernel reclaims on demand (page cache, reclaimable slab): on a
  // one-node machine /proc/meminfo's MemAvailable, per node MemFree + Inactive(file) +
  // SReclaimable of the node's meminfo.
  uint64_t available_bytes = 0;
  // This process's resident pages on the node (/proc/self/numa_maps); 0 where the OS does not say.
  uint64_t process_bytes = 0;
  bool process_bytes_known = false;
};

// Bytes per NUMA node in /proc/<pid>/numa_maps text: every mapping's "N<node>=<pages>" times its
// "kernelpagesize_kB=<k>" (4 KiB when a line does not say). Malformed fields are skipped.
std::map<int, uint64_t> numaMapsBytesPerNode(std::string_view numa_maps);

// One entry per node of detectNumaTopology() (one for the whole machine without NUMA).
std::vector<HostNodeMemory> hostNodeMemory();

}  // namespace tandem
