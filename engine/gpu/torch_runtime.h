#pragma once
// What the linked libtorch offers: its version, whether it has CUDA, and the GPUs it can see.
// No libtorch types in here, so the CLI and the planner can include it cheaply.

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::gpu {

struct GpuInfo {
  int index = 0;
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
};

struct TorchRuntimeInfo {
  std::string torch_version;
  bool torch_has_cuda = false;       // the libtorch build has CUDA support
  bool built_with_cuda = false;      // Tandem's own CUDA parts are compiled in (TANDEM_WITH_CUDA)
  std::string cuda_runtime_version;  // e.g. "13.0", empty when none
  std::string gpu_status;            // why no GPU is listed, when none is
  std::vector<GpuInfo> gpus;
  int intra_op_threads = 0;
};

TorchRuntimeInfo probeTorchRuntime();

// GPU `index`'s compute capability major version (9: Hopper); 0 without CUDA or that GPU.
int gpuComputeMajor(int index);

// Limits libtorch's intra-op threads so they do not fight the expert engine's pools.
void setTorchThreads(int n_threads);

// libtorch's CUDA caching allocator on GPU `index`: peaks since the last reset (what the tensors
// used, and what the allocator held from the driver).
struct GpuMemoryPeak {
  uint64_t allocated_bytes = 0;
  uint64_t reserved_bytes = 0;
};
GpuMemoryPeak gpuMemoryPeak(int index);
void resetGpuMemoryPeak(int index);
// Lets the allocator hold at most `bytes` on GPU `index` (a smaller card's memory, for
// benchmarks); allocations beyond fail as out of memory. Error without CUDA.
void capGpuMemory(int index, uint64_t bytes);

// Long sequences (issue 29): every length and layer kind allocates [tokens, ...] buffers of its
// own size, and the caching allocator's fixed segments then keep blocks no later request fits
// (the H200 runs reserved 16-34 % beyond the allocated peak at 16K-128K tokens). This turns on
// libtorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which grow
// one segment per stream instead, unless PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF already says
// expandable_segments either way (the user's choice stands). Best called before the first CUDA
// allocation: segments made before stay as they are. Returns whether they are on; false without
// CUDA.
bool useExpandableSegments();
// Training sets them from this many tokens per step (batch x cutoff_len), or with offloaded
// checkpoints, on a GPU (engine/train/training_run.cpp, bench/e2e_train_bench.cpp).
inline constexpr int64_t kExpandableSegmentsFromTokens = 8192;
// Whether libtorch's caching allocator makes expandable segments now.
bool expandableSegments();

}  // namespace tandem::gpu
