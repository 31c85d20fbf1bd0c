#include "engine/gpu/torch_runtime.h"

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "engine/gpu/memory_sample.h"

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

// The memory map's GPU column: a tensor's bytes show up as allocated (the allocator rounds to its
// 2 MiB blocks, so a 256 MiB tensor adds exactly its size), reserved covers allocated, and the
// driver's free and total bracket what the allocator holds.
TEST(GpuMemoryNow, FollowsTheCachingAllocator) {
  if (probeTorchRuntime().gpus.empty()) {
    EXPECT_TRUE(gpuMemoryNow().empty());
    GTEST_SKIP() << "no GPU here: gpuMemoryNow() is empty, as the memory map expects";
  }
  constexpr int64_t kBytes = int64_t{256} << 20;
  at::empty({1}, at::TensorOptions().device(at::kCUDA, 0));  // the allocator is set up
  const GpuMemoryFigures before = gpuMemoryNow().at(0);
  const at::Tensor block =
      at::empty({kBytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
  const GpuMemoryFigures after = gpuMemoryNow().at(0);
  EXPECT_EQ(after.allocated_bytes - before.allocated_bytes, static_cast<uint64_t>(block.nbytes()));
  EXPECT_GE(after.reserved_bytes, after.allocated_bytes);
  EXPECT_GT(after.total_bytes, 0u);
  EXPECT_LE(after.free_bytes + after.reserved_bytes, after.total_bytes);
  EXPECT_EQ(after.index, 0);
}

}  // namespace
}  // namespace tandem::gpu
