#include "engine/core/numa.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/platform/environment.h"
#include "engine/core/platform/system_memory.h"

namespace tandem {
namespace {

void expectConsistent(const NumaTopology& topology) {
  ASSERT_FALSE(topology.nodes.empty());
  std::set<int> seen;
  for (const NumaNode& node : topology.nodes) {
    EXPECT_LE(node.free_bytes, node.total_bytes);
    for (int cpu : node.cpus) EXPECT_TRUE(seen.insert(cpu).second) << "cpu " << cpu << " twice";
  }
  // Every CPU this process may use belongs to exactly one node.
  EXPECT_EQ(topology.totalCpus(), cpuFeatures().logical_cpus);
  for (const NumaNode& node : topology.nodes) EXPECT_GT(node.total_bytes, 0u);
}

// The kernel's per-node figure, an independent reference for libnuma's answer. (It need not
// add up to sysinfo's RAM: VMs with hot-plugged memory report less per node.)
uint64_t sysfsNodeMemTotal(int node) {
  std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find("MemTotal:");
    if (at != std::string::npos) return std::stoull(line.substr(at + 9)) * 1024;
  }
  return 0;
}

TEST(Numa, DetectedTopologyIsConsistent) {
  const NumaTopology topology = detectNumaTopology();
  expectConsistent(topology);
  if (!topology.numa_available) return;
  for (const NumaNode& node : topology.nodes) {
    EXPECT_EQ(node.total_bytes, sysfsNodeMemTotal(node.id)) << "node " << node.id;
  }
}

TEST(Numa, SingleNodeFallbackIsTheWholeMachine) {
  const NumaTopology single = singleNodeTopology();
  EXPECT_FALSE(single.numa_available);
  ASSERT_EQ(single.nodes.size(), 1u);
  expectConsistent(single);
  const uint64_t total_bytes = platform::systemMemoryBytes().total_bytes;
  ASSERT_GT(total_bytes, 0u);
  EXPECT_EQ(single.totalBytes(), total_bytes);
}

TEST(Numa, EnvironmentCanTurnNumaOff) {
  platform::setEnvironmentVariable("TANDEM_NUMA", "off");
  const NumaTopology topology = detectNumaTopology();
  platform::unsetEnvironmentVariable("TANDEM_NUMA");
  EXPECT_FALSE(topology.numa_available);
  EXPECT_EQ(topology.nodes.size(), 1u);
}

}  // namespace
}  // namespace tandem
