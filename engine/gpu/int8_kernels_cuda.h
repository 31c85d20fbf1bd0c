#pragma once
// The CUDA kernels of int8 experts on a GPU (int8_cast.h, row_scale.h), free of torch headers so
// nvcc compiles them quickly.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::gpu {

// n int8 values at src -> bf16 at dst, queued on `stream`. src and dst 16-byte aligned.
cudaError_t launchInt8ToBf16(const int8_t* src, void* dst, int64_t n, cudaStream_t stream);

// out[p, o] = in[p, o] · scale[row_expert[p], o] for rows p < rows of cols values, computed in
// fp32 and rounded once to out's type. in and out bf16 or fp32 (…_bf16: 2-byte elements);
// scale [n, cols] fp32; row_expert [rows] int64. Queued on `stream`.
cudaError_t launchScaleRowsByExpert(const void* in, bool in_bf16, const float* scale,
                                    const int64_t* row_expert, void* out, bool out_bf16,
                                    int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace tandem::gpu
