#pragma once
// Int8 experts' row scales applied to their products' outputs (torch_experts.h): the grouped
// pairs' rows y [P, out] times their expert's scales, x (q · s)ᵀ = (x qᵀ) ⊙ s. As torch ops this
// is a [P, out] fp32 gather of the scales, a mixed-dtype multiply and a cast, three passes and
// about a tenth of a V2-Lite step's GPU time on the H200; on a CUDA device our kernel
// (int8_kernels_cuda.cu) does it in one pass, with the same rounding.

#include <ATen/core/Tensor.h>

namespace tandem::gpu {

// y [P, out] (bf16 or fp32), scale [n, out] fp32, row_expert [P] int64 (each row's expert, 0..n-1)
// -> y ⊙ scale[row_expert] computed in fp32 and rounded once to out_dtype. Differentiable in y
// (the scales are frozen): d y = d out ⊙ scale[row_expert], rounded to y's dtype.
at::Tensor scaleRowsByExpert(const at::Tensor& y, const at::Tensor& scale,
                             const at::Tensor& row_expert, at::ScalarType out_dtype);

}  // namespace tandem::gpu
