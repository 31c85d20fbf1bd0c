#pragma once
// Int8 expert weights cast to the model dtype where they are (stored_expert_weights.h casts a
// layer's experts twice a checkpointed training step). torch's cast of mixed dtypes runs element
// by element: on an H200 it moved a V2-Lite layer's gate (185 M weights) at 1.1 TB/s, 0.48 ms;
// the casts were a third of a V2-Lite step's expert time. On a CUDA device to bf16 our kernel
// (int8_kernels_cuda.cu) reads and writes 16 weights a thread, 0.20 ms; elsewhere torch's cast.

#include <ATen/core/Tensor.h>

namespace tandem::gpu {

// q int8, any shape -> the same values (exact) in `dtype`, contiguous, on q's device.
at::Tensor castInt8(const at::Tensor& q, at::ScalarType dtype);

}  // namespace tandem::gpu
