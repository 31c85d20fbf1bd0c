#include "engine/core/numa.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine/core/platform/cpu_affinity.h"
#include "engine/core/platform/numa_nodes.h"
#include "engine/core/platform/system_memory.h"

namespace tandem {

namespace {

bool numaDisabledByEnvironment() {
  const char* value = std::getenv("TANDEM_NUMA");
  return value && std::strcmp(value, "off") == 0;
}

}  // namespace

int NumaTopology::totalCpus() const {
  int n = 0;
  for (const auto& node : nodes) n += static_cast<int>(node.cpus.size());
  return n;
}

uint64_t NumaTopology::totalBytes() const {
  uint64_t n = 0;
  for (const auto& node : nodes) n += node.total_bytes;
  return n;
}

NumaTopology singleNodeTopology() {
  NumaTopology topology;
  NumaNode node;
  node.cpus = platform::allowedCpuIds();
  const platform::SystemMemoryBytes memory = platform::systemMemoryBytes();
  node.total_bytes = memory.total_bytes;
  node.free_bytes = memory.free_bytes;
  topology.nodes.push_back(std::move(node));
  return topology;
}

NumaTopology detectNumaTopology() {
  if (numaDisabledByEnvironment() || !platform::numaSupported()) return singleNodeTopology();
  const std::vector<int> allowed = platform::allowedCpuIds();
  NumaTopology topology;
  topology.numa_available = true;
  for (int id = 0; id <= platform::numaHighestNodeId(); ++id) {
    if (!platform::numaNodeExists(id)) continue;
    NumaNode node;
    node.id = id;
    const platform::NumaNodeMemoryBytes memory = platform::numaNodeMemoryBytes(id);
    node.total_bytes = memory.total_bytes;
    node.free_bytes = memory.free_bytes;
    for (int cpu : platform::numaNodeCpuIds(id)) {
      if (std::binary_search(allowed.begin(), allowed.end(), cpu)) node.cpus.push_back(cpu);
    }
    // Memory-only nodes (CXL, HBM) matter for placement; nodes with neither do not.
    if (!node.cpus.empty() || node.total_bytes > 0) topology.nodes.push_back(std::move(node));
  }
  if (topology.nodes.empty() || topology.totalCpus() == 0) return singleNodeTopology();
  return topology;
}

}  // namespace tandem
