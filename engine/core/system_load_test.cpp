#include "engine/core/system_load.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "engine/core/numa.h"
#include "engine/core/platform/gpu_telemetry.h"

namespace tandem {
namespace {

// With every CPU of this process spinning, the nodes' load is high; each value is a percentage.
TEST(CpuLoadMeter, SeesTheCpusThisProcessKeepsBusy) {
  CpuLoadMeter meter;
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  const int cpus = detectNumaTopology().totalCpus();
  for (int i = 0; i < cpus; ++i) {
    spinners.emplace_back([&] {
      volatile uint64_t x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const std::vector<NodeLoad> busy = meter.sample();
  stop = true;
  for (std::thread& t : spinners) t.join();
  ASSERT_EQ(busy.size(), detectNumaTopology().nodes.size());
  double mean = 0;
  for (const NodeLoad& n : busy) {
    EXPECT_GE(n.busy_percent, 0.0);
    EXPECT_LE(n.busy_percent, 100.0);
    mean += n.busy_percent / static_cast<double>(busy.size());
  }
  EXPECT_GT(mean, 50.0);
}

// NVML answers exactly where NVIDIA's driver is installed: the GPUs with their memory, or nothing.
TEST(GpuTelemetry, ListsTheGpusWhereTheDriverIs) {
  const std::vector<platform::GpuTelemetry> gpus = platform::readGpuTelemetry();
  if (!std::filesystem::exists("/dev/nvidiactl")) {
    EXPECT_TRUE(gpus.empty());
    return;
  }
  ASSERT_FALSE(gpus.empty());
  for (const platform::GpuTelemetry& g : gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_GT(g.memory_total_bytes, uint64_t{1} << 30);
    EXPECT_LE(g.memory_used_bytes, g.memory_total_bytes);
    EXPECT_GE(g.utilisation_percent, 0.0);
    EXPECT_LE(g.utilisation_percent, 100.0);
  }
}

}  // namespace
}  // namespace tandem
