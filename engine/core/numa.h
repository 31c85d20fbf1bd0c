#pragma once
// NUMA topology: nodes with their CPUs and memory. A machine without NUMA support (or with
// libnuma unable to answer) is reported as one node holding every CPU and all RAM, so callers
// never special-case "no NUMA". TANDEM_NUMA=off forces that single-node view.

#include <cstdint>
#include <vector>

namespace tandem {

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;     // logical CPU ids on this node that this process may use
  uint64_t total_bytes = 0;  // memory on the node
  uint64_t free_bytes = 0;
};

struct NumaTopology {
  bool numa_available = false;  // false: the single node below is the whole machine
  std::vector<NumaNode> nodes;  // never empty

  int totalCpus() const;
  uint64_t totalBytes() const;
};

// Reads the topology once per call (memory figures are live).
NumaTopology detectNumaTopology();

// The whole machine as one node, from sysconf/sysinfo: the fallback of detectNumaTopology().
NumaTopology singleNodeTopology();

}  // namespace tandem
