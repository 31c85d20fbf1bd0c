#include "engine/gpu/attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

namespace tandem::gpu {
namespace {

// The spec: softmax(q kᵀ · scale + causal mask) v, k and v repeated per query-head group, in
// fp64 with the full [S, S] scores. q [B, h, S, dk], k [B, g, S, dk], v [B, g, S, dv] ->
// [B, S, h * dv].
at::Tensor referenceAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              double scale) {
  const int64_t groups = q.size(1) / k.size(1);
  const at::Tensor kr = k.to(at::kDouble).repeat_interleave(groups, 1);
  const at::Tensor vr = v.to(at::kDouble).repeat_interleave(groups, 1);
  const int64_t s = q.size(2);
  const at::Tensor mask = at::ones({s, s}, at::kBool).triu(1);
  const at::Tensor scores =
      at::matmul(q.to(at::kDouble), kr.transpose(-1, -2)).mul(scale).masked_fill(mask, -INFINITY);
  const at::Tensor out = at::matmul(at::softmax(scores, -1), vr);
  return out.transpose(1, 2).reshape({q.size(0), s, -1}).to(q.scalar_type());
}

struct Shape {
  int64_t heads, kv_heads, dk, dv;
};

class CausalAttentionTest : public ::testing::TestWithParam<Shape> {};

// GQA (Qwen3: 32/4 heads, 128), MLA (DeepSeek: dk 192, dv 128, scaled down), plain MHA.
INSTANTIATE_TEST_SUITE_P(Shapes, CausalAttentionTest,
                         ::testing::Values(Shape{8, 2, 16, 16}, Shape{4, 4, 24, 16},
                                           Shape{4, 4, 192, 128}, Shape{4, 1, 32, 32}));

TEST_P(CausalAttentionTest, MatchesTheSpecOnAFusedKernel) {
  const Shape p = GetParam();
  at::manual_seed(5);
  const int64_t seq = 37;
  const at::Tensor q = at::randn({2, p.heads, seq, p.dk});
  const at::Tensor k = at::randn({2, p.kv_heads, seq, p.dk});
  const at::Tensor v = at::randn({2, p.kv_heads, seq, p.dv});
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.dk));
  // On the CPU torch's flash kernel takes every one of these (MLA through the padded v): the
  // math path, which builds [S, S], is never chosen.
  EXPECT_EQ(causalAttentionKernel(q, k, v, scale), "flash");
  const at::Tensor out = causalAttention(q, k, v, scale);
  ASSERT_EQ(out.sizes(), (at::IntArrayRef{2, seq, p.heads * p.dv}));
  EXPECT_TRUE(at::allclose(out, referenceAttention(q, k, v, scale), 1e-5, 1e-5));
}

TEST_P(CausalAttentionTest, GradientsMatchTheSpec) {
  const Shape p = GetParam();
  at::manual_seed(6);
  const int64_t seq = 19;
  const at::Tensor q = at::randn({1, p.heads, seq, p.dk}).requires_grad_(true);
  const at::Tensor k = at::randn({1, p.kv_heads, seq, p.dk}).requires_grad_(true);
  const at::Tensor v = at::randn({1, p.kv_heads, seq, p.dv}).requires_grad_(true);
  const double scale = 0.2;
  const at::Tensor w = at::randn({1, seq, p.heads * p.dv});
  (causalAttention(q, k, v, scale) * w).sum().backward();
  const at::Tensor dq = q.grad().clone(), dk = k.grad().clone(), dv = v.grad().clone();
  q.mutable_grad() = k.mutable_grad() = v.mutable_grad() = at::Tensor();
  (referenceAttention(q, k, v, scale) * w).sum().backward();
  EXPECT_TRUE(at::allclose(dq, q.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(dk, k.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(dv, v.grad(), 1e-4, 1e-5));
}

}  // namespace
}  // namespace tandem::gpu
