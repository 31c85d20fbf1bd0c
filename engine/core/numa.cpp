#include "engine/core/numa.h"

#include <numa.h>
#include <sched.h>
#include <sys/sysinfo.h>

#include <cstdlib>
#include <cstring>
#include <memory>

namespace tandem {

namespace {

std::vector<int> allowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

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
  node.cpus = allowedCpus();
  struct sysinfo info = {};
  if (sysinfo(&info) == 0) {
    node.total_bytes = static_cast<uint64_t>(info.totalram) * info.mem_unit;
    node.free_bytes = static_cast<uint64_t>(info.freeram) * info.mem_unit;
  }
  topology.nodes.push_back(std::move(node));
  return topology;
}

NumaTopology detectNumaTopology() {
  if (numaDisabledByEnvironment() || numa_available() < 0) return singleNodeTopology();
  const std::vector<int> allowed = allowedCpus();
  std::unique_ptr<bitmask, decltype(&numa_free_cpumask)> mask(numa_allocate_cpumask(),
                                                              &numa_free_cpumask);
  NumaTopology topology;
  topology.numa_available = true;
  for (int id = 0; id <= numa_max_node(); ++id) {
    if (!numa_bitmask_isbitset(numa_all_nodes_ptr, id)) continue;
    NumaNode node;
    node.id = id;
    long long free_bytes = 0;
    const long long total = numa_node_size64(id, &free_bytes);
    node.total_bytes = total > 0 ? static_cast<uint64_t>(total) : 0;
    node.free_bytes = free_bytes > 0 ? static_cast<uint64_t>(free_bytes) : 0;
    numa_bitmask_clearall(mask.get());
    if (numa_node_to_cpus(id, mask.get()) == 0) {
      for (int cpu : allowed) {
        if (numa_bitmask_isbitset(mask.get(), cpu)) node.cpus.push_back(cpu);
      }
    }
    // Memory-only nodes (CXL, HBM) matter for placement; nodes with neither do not.
    if (!node.cpus.empty() || node.total_bytes > 0) topology.nodes.push_back(std::move(node));
  }
  if (topology.nodes.empty() || topology.totalCpus() == 0) return singleNodeTopology();
  return topology;
}

}  // namespace tandem
