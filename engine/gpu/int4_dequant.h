#pragma once
// Int4 expert weights dequantised where they are (stored_expert_weights.h: offload mode streams a
// layer's experts as Tandem int4 tables and resident experts keep them so; each layer call turns
// them into the model dtype once in forward and once in backward, a transient copy never kept).
// The tables are the CPU expert engine's (experts/expert_blocks.h): per group of `group` inputs of
// a row an f16 scale d (and, asymmetric, an f16 minimum m), then the nibbles, element j in the low
// nibble of byte j and element j + group/2 in its high one; w = d · (q − 8) or d · q + m.
//
// The weights are the CPU engine's reference decoder's (ref::dequantBlocks: fp32, no fused
// multiply-add), rounded once to `dtype`: fp32 gives them bitwise, bf16 their nearest bf16, as the
// CPU's bf16 block backends (amx_blocks, avx512_bf16_blocks) decode them into bf16 tiles. On a
// CUDA device to bf16 or fp32 our kernel (int4_kernels_cuda.cu); elsewhere torch ops (the same
// arithmetic, one op at a time).

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tandem::gpu {

// tables uint8 [..., rows, cols / group · block bytes] (block bytes: 2 + group/2 symmetric, 4 +
// group/2 asymmetric) -> [..., rows, cols] in `dtype`, contiguous, on tables' device. group 32, 64
// or 128 dividing cols; Error otherwise (a table of the wrong width included).
at::Tensor dequantiseInt4(const at::Tensor& tables, int64_t cols, int group, bool symmetric,
                          at::ScalarType dtype);

// The same with torch ops only, on any device (the fallback, and the CUDA kernel's reference).
at::Tensor dequantiseInt4WithTorchOps(const at::Tensor& tables, int64_t cols, int group,
                                      bool symmetric, at::ScalarType dtype);

}  // namespace tandem::gpu
