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

}  // namespace tandem::gpu
