#include "engine/model/machine_probe.h"

#include <gtest/gtest.h>

#include "engine/gpu/torch_runtime.h"

namespace tandem::model {
namespace {

TEST(MachineProbe, SeesThisMachineAndTheGpusLibtorchSees) {
  std::string status;
  const placement::Hardware hw = probeMachine(&status);
  EXPECT_EQ(hw.source, "probe");
  ASSERT_FALSE(hw.numa_nodes.empty());
  EXPECT_GT(hw.ramBytes(), 0u);
  EXPECT_GE(hw.cpu.physical_cores, 1);
  if (hw.gpus.empty()) {
    EXPECT_FALSE(status.empty()) << "no GPU and no reason given";
  }
  for (const placement::GpuSpec& g : hw.gpus) EXPECT_GT(g.total_bytes, 0u);
  EXPECT_EQ(hw.gpus.size(), gpu::probeTorchRuntime().gpus.size());
}

}  // namespace
}  // namespace tandem::model
