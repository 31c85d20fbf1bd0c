#include "engine/gpu/host_block.h"

#include <ATen/ATen.h>

#include <string>

#include "engine/core/error.h"

#ifdef TANDEM_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tandem::gpu {

namespace {

int64_t aligned(int64_t bytes) {
  return (bytes + kHostBlockAlignment - 1) / kHostBlockAlignment * kHostBlockAlignment;
}

int64_t tensorBytes(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
  for (const int64_t d : shape) n *= d;
  return n;
}

}  // namespace

at::Tensor hostBlock(int64_t bytes, bool pinned) {
  const at::TensorOptions options = at::TensorOptions().dtype(at::kByte);
#ifdef TANDEM_WITH_CUDA
  if (pinned && bytes > 0) {
    void* data = nullptr;
    const cudaError_t status =
        cudaHostAlloc(&data, static_cast<size_t>(bytes), cudaHostAllocDefault);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // clear it: the next CUDA call must not report it again
      throw Error("could not page-lock " + std::to_string(bytes >> 20) +
                      " MiB of host memory for the experts copied to the GPU (" +
                      cudaGetErrorString(status) + ")",
                  "free host memory, lower the model's depth, or keep more experts resident "
                  "(gpu_experts) so fewer are streamed");
    }
    // torch sees it as pinned (cudaPointerGetAttributes); copies from it are asynchronous.
    return at::from_blob(
        data, {bytes}, [](void* p) { (void)cudaFreeHost(p); }, options);
  }
#endif
  return at::empty({bytes}, options.pinned_memory(pinned));
}

int64_t hostBlockBytes(
    const std::vector<std::pair<std::vector<int64_t>, at::ScalarType>>& tensors) {
  int64_t bytes = 0;
  for (const auto& [shape, dtype] : tensors) bytes += aligned(tensorBytes(shape, dtype));
  return bytes;
}

std::vector<at::Tensor> carveHostBlock(
    const std::vector<std::pair<std::vector<int64_t>, at::ScalarType>>& tensors, bool pinned) {
  const at::Tensor block = hostBlock(hostBlockBytes(tensors), pinned);
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& [shape, dtype] : tensors) {
    const int64_t bytes = tensorBytes(shape, dtype);
    out.push_back(block.narrow(0, offset, bytes).view(dtype).view(shape));
    offset += aligned(bytes);
  }
  return out;
}

}  // namespace tandem::gpu
