#pragma once
// A failed launch of one of the int8 experts' CUDA kernels (int8_kernels_cuda.h) as the Error the
// user sees. Only for CUDA builds.

#include <cuda_runtime_api.h>

#include <string>

#include "engine/core/error.h"

namespace tandem::gpu {

inline void throwIfLaunchFailed(cudaError_t status, const std::string& what,
                                const std::string& device) {
  if (status == cudaSuccess) return;
  throw Error(what + " on " + device + " failed: " + cudaGetErrorString(status),
              "check the GPU with nvidia-smi, or use experts_format: bf16");
}

}  // namespace tandem::gpu
