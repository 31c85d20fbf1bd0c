#include "engine/gpu/norm.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

namespace tandem::gpu {
namespace {

// transformers' RMSNorm, op for op (the form rmsNorm keeps for autograd).
at::Tensor reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  return weight * (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
}

// In a FusedRmsNormScope without autograd rmsNorm takes the fused row loop; it must agree with the
// composite form on odd shapes: to fp32 rounding in fp32, within one bf16 rounding step in bf16.
TEST(RmsNorm, FusedRowsMatchTheCompositeForm) {
  at::manual_seed(0);
  for (const auto& shape : {std::vector<int64_t>{1, 1, 2048}, {3, 5, 37}, {2, 12, 1, 64}, {7, 1}}) {
    const at::Tensor x = at::randn(shape) * 3.0;
    const at::Tensor w = at::rand({shape.back()}) + 0.5;
    c10::NoGradGuard no_grad;
    const FusedRmsNormScope fused;
    const at::Tensor f32 = rmsNorm(x, w, 1e-6);
    EXPECT_TRUE(at::allclose(f32, reference(x, w, 1e-6), 1e-6, 1e-6)) << x.sizes();
    const at::Tensor xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16);
    const at::Tensor b16 = rmsNorm(xb, wb, 1e-6).to(at::kFloat),
                     ref = reference(xb, wb, 1e-6).to(at::kFloat);
    EXPECT_LE((b16 - ref).abs().max().item<float>(), 2e-2f * ref.abs().max().item<float>())
        << x.sizes();
  }
}

TEST(RmsNorm, AutogradKeepsTheCompositeForm) {
  const FusedRmsNormScope fused;
  const at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  const at::Tensor w = at::ones({8});
  const at::Tensor y = rmsNorm(x, w, 1e-6);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_TRUE(x.grad().defined());
}

}  // namespace
}  // namespace tandem::gpu
