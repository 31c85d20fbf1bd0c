#pragma once
// RMSNorm as every target architecture defines it: normalise in fp32, cast back to the input
// dtype, then multiply by the weight (in the weight's dtype).

#include <ATen/core/Tensor.h>

namespace tandem::gpu {

// x [..., d], weight [d].
at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace tandem::gpu
