#include "engine/gpu/int8_cast.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/gpu/torch_runtime.h"

namespace tandem::gpu {
namespace {

// Every int8 value, repeated to n, in a fixed pseudo-random order.
at::Tensor int8Values(int64_t n) {
  at::manual_seed(3);
  return at::randint(-128, 128, {n}, at::kChar);
}

void expectSameValues(const at::Tensor& got, const at::Tensor& q, at::ScalarType dtype, const std::string& what) {
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
  if (probeTorchRuntime().gpus.empty() || !probeTorchRuntime().built_with_cuda) {
    GTEST_SKIP() << "no GPU, or built without Tandem's CUDA parts";
  }
  const at::Device gpu(at::kCUDA, 0);
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{4111},
                          int64_t{8192} * 256 * 16 * 2 + 9}) {
    const at::Tensor q = int8Values(n).to(gpu);
    expectSameValues(castInt8(q, at::kBFloat16), q, at::kBFloat16, "n " + std::to_string(n));
  }
  const at::Tensor q = int8Values(3 * 4099).to(gpu).view({3, 4099});
  expectSameValues(castInt8(q.view({-1}).narrow(0, 1, 4098), at::kBFloat16), q.view({-1}).narrow(0, 1, 4098),
                   at::kBFloat16, "misaligned");
  expectSameValues(castInt8(q.t(), at::kBFloat16), q.t(), at::kBFloat16, "transposed");
  expectSameValues(castInt8(q, at::kFloat), q, at::kFloat, "fp32");
}

}  // namespace
}  // namespace tandem::gpu
