#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/gpu/int8_cast.h"
#include "engine/gpu/row_scale.h"
#include "engine/gpu/torch_runtime.h"

namespace tandem::gpu {
namespace {

// Every int8 value, repeated to n, in a fixed pseudo-random order.
at::Tensor int8Values(int64_t n) {
  at::manual_seed(3);
  return at::randint(-128, 128, {n}, at::kChar);
}

bool hasCudaKernels() {
  return !probeTorchRuntime().gpus.empty() && probeTorchRuntime().built_with_cuda;
}

void expectSameValues(const at::Tensor& got, const at::Tensor& q, at::ScalarType dtype,
                      const std::string& what) {
  EXPECT_EQ(got.scalar_type(), dtype) << what;
  EXPECT_EQ(got.sizes(), q.sizes()) << what;
  EXPECT_TRUE(got.is_contiguous()) << what;
  EXPECT_TRUE(at::equal(got.cpu().to(at::kFloat), q.cpu().to(at::kFloat))) << what;
}

// The portable path: torch's cast, exact, in every dtype the experts compute in.
TEST(CastInt8, OnTheCpuEveryDtypeHoldsTheValuesExactly) {
  const at::Tensor q = int8Values(1000).view({10, 100});
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    expectSameValues(castInt8(q, dtype), q, dtype, c10::toString(dtype));
  }
  expectSameValues(castInt8(q.t(), at::kBFloat16), q.t(), at::kBFloat16, "transposed");
}

// The CUDA kernel against torch's cast on odd sizes (tails of 1 to 15 values past the 16-value
// vectors, fewer values than one vector, more than its grid covers in one pass), and the views
// it must hand to torch (misaligned, non-contiguous).
TEST(CastInt8, TheCudaKernelEqualsTorchsCastOnOddSizes) {
  if (!hasCudaKernels()) GTEST_SKIP() << "no GPU, or built without Tandem's CUDA parts";
  const at::Device gpu(at::kCUDA, 0);
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{4111},
                          int64_t{8192} * 256 * 16 * 2 + 9}) {
    const at::Tensor q = int8Values(n).to(gpu);
    expectSameValues(castInt8(q, at::kBFloat16), q, at::kBFloat16, "n " + std::to_string(n));
  }
  const at::Tensor q = int8Values(3 * 4099).to(gpu).view({3, 4099});
  expectSameValues(castInt8(q.view({-1}).narrow(0, 1, 4098), at::kBFloat16),
                   q.view({-1}).narrow(0, 1, 4098), at::kBFloat16, "misaligned");
  expectSameValues(castInt8(q.t(), at::kBFloat16), q.t(), at::kBFloat16, "transposed");
  expectSameValues(castInt8(q, at::kFloat), q, at::kFloat, "fp32");
}

// The reference: torch's ops, differentiated by autograd.
std::pair<at::Tensor, at::Tensor> torchRowScale(const at::Tensor& y, const at::Tensor& scale,
                                                const at::Tensor& row_expert,
                                                at::ScalarType out_dtype, const at::Tensor& d_out) {
  const at::Tensor x = y.detach().requires_grad_(true);
  const at::Tensor out = (x.to(at::kFloat) * scale.index_select(0, row_expert)).to(out_dtype);
  out.backward(d_out);
  return {out.detach(), x.grad()};
}

// scaleRowsByExpert on `device` against the reference, bitwise (both multiply in fp32 and round
// once), for every pair of value and output dtypes, rows of odd lengths and experts in any order.
void expectRowScaleEqualsTorchs(at::Device device) {
  at::manual_seed(5);
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {37, 45}, {300, 1411}}) {
    for (const at::ScalarType in_dtype : {at::kBFloat16, at::kFloat}) {
      for (const at::ScalarType out_dtype : {at::kBFloat16, at::kFloat}) {
        const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " +
                                 c10::toString(in_dtype) + " -> " + c10::toString(out_dtype);
        const auto on = at::TensorOptions().device(device);
        const at::Tensor y = at::randn({rows, cols}, on.dtype(in_dtype));
        const at::Tensor scale = at::rand({5, cols}, on.dtype(at::kFloat)) + 0.01;
        const at::Tensor row_expert = at::randint(0, 5, {rows}, on.dtype(at::kLong));
        const at::Tensor d_out = at::randn({rows, cols}, on.dtype(out_dtype));
        const auto [want, want_dy] = torchRowScale(y, scale, row_expert, out_dtype, d_out);
        const at::Tensor x = y.detach().requires_grad_(true);
        const at::Tensor got = scaleRowsByExpert(x, scale, row_expert, out_dtype);
        got.backward(d_out);
        EXPECT_EQ(got.scalar_type(), out_dtype) << what;
        EXPECT_TRUE(at::equal(got.cpu(), want.cpu())) << what;
        ASSERT_TRUE(x.grad().defined()) << what;
        EXPECT_EQ(x.grad().scalar_type(), in_dtype) << what;
        EXPECT_TRUE(at::equal(x.grad().cpu(), want_dy.cpu())) << what;
      }
    }
  }
}

// Off CUDA the op is torch's own, wrapped in its autograd node: the gradient must still be the
// values' (d out ⊙ the scales), in the values' dtype.
TEST(ScaleRowsByExpert, OnTheCpuItsGradientIsTorchs) { expectRowScaleEqualsTorchs(at::kCPU); }

TEST(ScaleRowsByExpert, TheCudaKernelEqualsTorchsOpsOnOddShapes) {
  if (!hasCudaKernels()) GTEST_SKIP() << "no GPU, or built without Tandem's CUDA parts";
  expectRowScaleEqualsTorchs(at::Device(at::kCUDA, 0));
}

}  // namespace
}  // namespace tandem::gpu
