// Host memory per NUMA node: numa_maps arithmetic against hand-counted lines, and the live figures
// against an allocation this test makes and touches.

#include "engine/core/host_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

namespace tandem {
namespace {

// Lines as Linux 6.1 writes them (two nodes, a 2 MiB huge page mapping, a mapping without pages).
constexpr std::string_view kNumaMaps =
    "55d0c8a00000 default file=/usr/bin/tandem mapped=6 N0=6 kernelpagesize_kB=4\n"
    "7f1c00000000 interleave:0-1 anon=300 dirty=300 N0=100 N1=200 kernelpagesize_kB=4\n"
    "7f1e00000000 bind:1 anon=3 dirty=3 huge N1=3 kernelpagesize_kB=2048\n"
    "7f2000000000 default\n"
    "7ffd1e5f0000 default stack anon=9 dirty=9 N0=9 kernelpagesize_kB=4 Nx=3 N2=bad\n";

TEST(HostMemory, NumaMapsCountsPagesTimesTheirSize) {
  const std::map<int, uint64_t> bytes = numaMapsBytesPerNode(kNumaMaps);
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(bytes.at(0), (6u + 100u + 9u) * 4096u);
  EXPECT_EQ(bytes.at(1), 200u * 4096u + 3u * (2048u << 10));
  EXPECT_TRUE(numaMapsBytesPerNode("").empty());
  EXPECT_TRUE(numaMapsBytesPerNode("garbage without fields\n\n").empty());
}

TEST(HostMemory, NodesAddUpAndSeeThisProcessGrow) {
  const std::vector<HostNodeMemory> before = hostNodeMemory();
  ASSERT_FALSE(before.empty());
  for (const HostNodeMemory& node : before) {
    EXPECT_GT(node.total_bytes, 0u);
    EXPECT_LE(node.available_bytes, node.total_bytes);
  }
  if (!before.front().process_bytes_known) GTEST_SKIP() << "the OS gives no numa_maps here";
  auto processTotal = [](const std::vector<HostNodeMemory>& nodes) {
    uint64_t sum = 0;
    for (const HostNodeMemory& n : nodes) sum += n.process_bytes;
    return sum;
  };
  // 64 MiB touched page by page become resident somewhere on the machine's nodes.
  constexpr size_t kBytes = size_t{64} << 20;
  const std::unique_ptr<char[]> block(new char[kBytes]);
  std::memset(block.get(), 1, kBytes);
  const uint64_t grown = processTotal(hostNodeMemory()) - processTotal(before);
  EXPECT_GE(grown, kBytes - (size_t{4} << 20)) << "grew by " << grown;
  EXPECT_EQ(block[kBytes - 1], 1);
}

}  // namespace
}  // namespace tandem
