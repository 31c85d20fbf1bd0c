#pragma once
// The CUDA side of castInt8 (int8_cast.h), free of torch headers so nvcc compiles it quickly.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::gpu {

// n int8 values at src -> bf16 at dst, queued on `stream`. src and dst 16-byte aligned.
cudaError_t launchInt8ToBf16(const int8_t* src, void* dst, int64_t n, cudaStream_t stream);

}  // namespace tandem::gpu
