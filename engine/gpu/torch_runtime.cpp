#include "engine/gpu/torch_runtime.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>

#include "engine/core/error.h"
#include "engine/gpu/memory_sample.h"

#ifdef TANDEM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace tandem::gpu {

namespace {

#ifdef TANDEM_WITH_CUDA
// Asks the CUDA runtime directly: it also tells *why* there is no GPU (no driver, no device).
void listGpus(TorchRuntimeInfo& info) {
  // The runtime answers its version without a driver, so `tandem doctor` can name it even then.
  int runtime_version = 0;
  if (cudaRuntimeGetVersion(&runtime_version) == cudaSuccess) {
    info.cuda_runtime_version =
        std::to_string(runtime_version / 1000) + "." + std::to_string(runtime_version % 1000 / 10);
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // The two common cases get a plain sentence; anything else shows CUDA's own words.
    if (status == cudaErrorInsufficientDriver) {
      info.gpu_status = "no NVIDIA driver, or one too old for this CUDA runtime";
    } else if (status == cudaErrorNoDevice) {
      info.gpu_status = "no NVIDIA GPU found";
    } else {
      info.gpu_status = std::string("no usable GPU: ") + cudaGetErrorString(status);
    }
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, i) != cudaSuccess) continue;
    GpuInfo gpu;
    gpu.index = i;
    gpu.name = props.name;
    gpu.total_bytes = props.totalGlobalMem;
    gpu.compute_major = props.major;
    gpu.compute_minor = props.minor;
    gpu.multiprocessors = props.multiProcessorCount;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(i) == cudaSuccess &&
        cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      gpu.free_bytes = free_bytes;
    }
    info.gpus.push_back(std::move(gpu));
  }
  if (info.gpus.empty()) info.gpu_status = "no GPU found";
}
#else
void listGpus(TorchRuntimeInfo& info) {
  if (!info.torch_has_cuda) {
    info.gpu_status =
        "no CUDA in this build (a CPU-only libtorch, or Tandem built without the CUDA "
        "toolkit: install nvcc and rebuild to use GPUs)";
    return;
  }
  try {
    const int count = at::detail::getCUDAHooks().getNumGPUs();
    info.gpu_status = count > 0 ? "libtorch sees " + std::to_string(count) +
                                      " GPU(s), but Tandem was built without the CUDA toolkit: "
                                      "rebuild with nvcc installed to use them"
                                : "no GPU found";
  } catch (const c10::Error&) {
    info.gpu_status = "no GPU found";
  }
}
#endif

}  // namespace

TorchRuntimeInfo probeTorchRuntime() {
  TorchRuntimeInfo info;
  info.torch_version = TANDEM_TORCH_VERSION;
#ifdef TANDEM_WITH_CUDA
  info.built_with_cuda = true;
#endif
  try {
    info.torch_has_cuda = at::detail::getCUDAHooks().hasCUDART() || at::hasCUDA();
  } catch (const c10::Error&) {
    info.torch_has_cuda = false;
  }
  listGpus(info);
  info.intra_op_threads = at::get_num_threads();
  return info;
}

void setTorchThreads(int n_threads) { at::set_num_threads(n_threads); }

#ifdef TANDEM_WITH_CUDA
int gpuComputeMajor(int index) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major;
}

GpuMemoryPeak gpuMemoryPeak(int index) {
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return {static_cast<uint64_t>(stats.allocated_bytes[kAll].peak),
          static_cast<uint64_t>(stats.reserved_bytes[kAll].peak)};
}

void resetGpuMemoryPeak(int index) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
}

std::vector<GpuMemoryFigures> gpuMemoryNow() {
  std::vector<GpuMemoryFigures> gpus;
  int count = 0, current = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return gpus;
  }
  // The allocator's stats exist only once libtorch has initialised CUDA (python's memory_stats
  // answers {} before that); before, nothing is allocated or reserved.
  c10::cuda::CUDACachingAllocator::CUDAAllocator* allocator =
      c10::cuda::CUDACachingAllocator::get();
  const bool allocator_ready = allocator != nullptr && allocator->initialized();
  constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  for (int i = 0; i < count; ++i) {
    GpuMemoryFigures g;
    g.index = i;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(i) != cudaSuccess ||
        cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    g.free_bytes = free_bytes;
    g.total_bytes = total_bytes;
    if (allocator_ready) {
      try {
        const auto stats = allocator->getDeviceStats(static_cast<c10::DeviceIndex>(i));
        g.allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes[kAll].current);
        g.reserved_bytes = static_cast<uint64_t>(stats.reserved_bytes[kAll].current);
      } catch (const c10::Error&) {
        // A device the allocator has not set up: nothing of ours on it.
      }
    }
    gpus.push_back(g);
  }
  cudaSetDevice(current);
  return gpus;
}

void capGpuMemory(int index, uint64_t bytes) {
  // The caching allocator exists only once libtorch has initialised CUDA (python's
  // set_per_process_memory_fraction does the same lazy init first).
  at::empty({1}, at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(index)));
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(index) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    throw Error("cannot read GPU " + std::to_string(index) + "'s memory size");
  }
  const double fraction =
      std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total_bytes));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                     static_cast<c10::DeviceIndex>(index));
}

bool expandableSegments() {
  return c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::expandable_segments();
}

bool useExpandableSegments() {
  auto says = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && std::string(value).find("expandable_segments") != std::string::npos;
  };
  if (!says("PYTORCH_CUDA_ALLOC_CONF") && !says("PYTORCH_ALLOC_CONF"))
    c10::cuda::CUDACachingAllocator::setAllocatorSettings("expandable_segments:True");
  return expandableSegments();
}
#else
int gpuComputeMajor(int) { return 0; }
bool expandableSegments() { return false; }
bool useExpandableSegments() { return false; }
GpuMemoryPeak gpuMemoryPeak(int) { return {}; }
void resetGpuMemoryPeak(int) {}
std::vector<GpuMemoryFigures> gpuMemoryNow() { return {}; }
void capGpuMemory(int, uint64_t) {
  throw Error("this build has no CUDA: there is no GPU memory to cap",
              "build Tandem with the CUDA toolkit");
}
#endif

}  // namespace tandem::gpu
