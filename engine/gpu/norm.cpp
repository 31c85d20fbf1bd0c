#include "engine/gpu/norm.h"

#include <ATen/ATen.h>

namespace tandem::gpu {

at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(variance + eps)).to(x.scalar_type());
}

}  // namespace tandem::gpu
