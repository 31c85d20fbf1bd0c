#include "engine/gpu/torch_runtime.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace tandem::gpu {
namespace {

TEST(TorchRuntime, ReportsVersionAndThreads) {
  const TorchRuntimeInfo info = probeTorchRuntime();
  EXPECT_FALSE(info.torch_version.empty());
  EXPECT_GE(info.intra_op_threads, 1);
  setTorchThreads(1);
  EXPECT_EQ(probeTorchRuntime().intra_op_threads, 1);
}

TEST(TorchRuntime, NoGpuIsExplainedNotFatal) {
  // On CI there is no GPU: the probe must say why instead of failing. On a GPU machine every
  // listed GPU has memory.
  const TorchRuntimeInfo info = probeTorchRuntime();
  if (info.gpus.empty()) {
    EXPECT_FALSE(info.gpu_status.empty());
  }
  for (const GpuInfo& gpu : info.gpus) {
    EXPECT_GT(gpu.total_bytes, 0u);
    EXPECT_LE(gpu.free_bytes, gpu.total_bytes);
  }
}

}  // namespace
}  // namespace tandem::gpu
