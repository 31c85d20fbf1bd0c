#include "engine/gpu/norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

namespace tandem::gpu {

namespace {

thread_local bool fused_norm_allowed = false;

// One pass per row on the CPU without autograd: a decode step runs ~25 norms of one row each,
// and the composite form below costs seven ATen ops (dispatch, allocation) per norm. Its values
// differ from the composite form's by rounding, hence FusedRmsNormScope.
template <typename T>
void rmsNormRows(const T* x, const T* weight, T* out, int64_t rows, int64_t d, float eps) {
  at::parallel_for(
      0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* row = x + r * d;
          double sum =
              0.0;  // the mean square in double, then rounded once, as fp32 rounds the exact value
          for (int64_t i = 0; i < d; ++i)
            sum += static_cast<double>(row[i]) * static_cast<double>(row[i]);
          const float inv =
              1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(d)) + eps);
          T* o = out + r * d;
          for (int64_t i = 0; i < d; ++i) {
            const T normed =
                static_cast<T>(static_cast<float>(row[i]) * inv);  // back to the input dtype first
            o[i] = static_cast<T>(static_cast<float>(weight[i]) * static_cast<float>(normed));
          }
        }
      });
}

bool fusable(const at::Tensor& x, const at::Tensor& weight) {
  if (!fused_norm_allowed) return false;
  if (c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) return false;
  const auto t = x.scalar_type();
  return x.device().is_cpu() && weight.device().is_cpu() &&
         (t == at::kFloat || t == at::kBFloat16) && weight.scalar_type() == t &&
         weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0);
}

}  // namespace

FusedRmsNormScope::FusedRmsNormScope() : previous_(fused_norm_allowed) {
  fused_norm_allowed = true;
}
FusedRmsNormScope::~FusedRmsNormScope() { fused_norm_allowed = previous_; }

at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (fusable(x, weight)) {
    const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
    at::Tensor out = at::empty_like(xc);
    const int64_t d = xc.size(-1), rows = d > 0 ? xc.numel() / d : 0;
    if (x.scalar_type() == at::kFloat) {
      rmsNormRows(xc.data_ptr<float>(), wc.data_ptr<float>(), out.data_ptr<float>(), rows, d,
                  static_cast<float>(eps));
    } else {
      rmsNormRows(xc.data_ptr<c10::BFloat16>(), wc.data_ptr<c10::BFloat16>(),
                  out.data_ptr<c10::BFloat16>(), rows, d, static_cast<float>(eps));
    }
    return out;
  }
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(variance + eps)).to(x.scalar_type());
}

}  // namespace tandem::gpu
