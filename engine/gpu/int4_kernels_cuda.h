#pragma once
// The CUDA kernel of int4 experts on a GPU (int4_dequant.h), free of torch headers so nvcc
// compiles it quickly.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::gpu {

// `blocks` Tandem int4 blocks of `group` weights (32, 64 or 128; experts/expert_blocks.h: f16 d,
// f16 m when asymmetric, then group / 2 bytes of nibbles) at `tables`, one after the other -> the
// blocks · group weights at `out` in order, bf16 (out_bf16) or fp32, queued on `stream`. Each
// weight is computed in fp32 as the CPU engine's reference decoder does (d · (q − 8), or d · q + m
// with the product rounded before the sum) and rounded once to out's type. tables 2-byte aligned,
// out 8-byte aligned. cudaErrorInvalidValue for another group.
cudaError_t launchInt4Dequantise(const uint8_t* tables, int64_t blocks, int group, bool symmetric,
                                 void* out, bool out_bf16, cudaStream_t stream);

}  // namespace tandem::gpu
