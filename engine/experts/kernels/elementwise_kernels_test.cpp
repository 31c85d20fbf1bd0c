// Every vector table's elementwise kernels (SiLU ⊙ up, its backward, axpy, bf16 widening) against
// ref:: on ragged lengths, with pre-activations far into both tails of the sigmoid.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/experts/kernels/vector_kernels_test_util.h"

namespace tandem::experts::kernels {
namespace {

std::vector<float> randomFloats(std::mt19937& rng, int64_t n, float bound) {
  std::uniform_real_distribution<float> dist(-bound, bound);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

::testing::AssertionResult near(const std::vector<float>& got, const std::vector<float>& want,
                                const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    // The vector exp is within a few fp32 ulps of std::exp.
    const double tol = 2e-6 * (1.0 + std::abs(want[i]));
    if (!(std::abs(got[i] - want[i]) <= tol)) {
      return ::testing::AssertionFailure()
             << what << ": first bad index " << i << " got " << got[i] << " want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

class VectorElementwise : public testing::VectorKernelsTest {
 protected:
  std::mt19937 rng_{11};
};

const int64_t kLengths[] = {1, 7, 8, 9, 16, 33, 768};

TEST_P(VectorElementwise, SiluMulMatchesRef) {
  for (const float bound : {4.0f, 120.0f}) {  // 120: exp(±g) past fp32's range
    for (const int64_t n : kLengths) {
      const std::vector<float> g = randomFloats(rng_, n, bound), u = randomFloats(rng_, n, 2.0f);
      std::vector<float> want(n + 1, -7.0f), got(n + 1, -7.0f);  // one past the end: untouched
      ref::siluMul(n, g.data(), u.data(), want.data());
      kernels().siluMul(n, g.data(), u.data(), got.data());
      EXPECT_TRUE(
          near(got, want, "siluMul n=" + std::to_string(n) + " |g|<" + std::to_string(bound)));
    }
  }
}

TEST_P(VectorElementwise, SiluBackwardMatchesRef) {
  for (const float bound : {4.0f, 120.0f}) {
    for (const int64_t n : kLengths) {
      const std::vector<float> g = randomFloats(rng_, n, bound), u = randomFloats(rng_, n, 2.0f);
      const std::vector<float> dh = randomFloats(rng_, n, 1.0f);
      std::vector<float> g_ref = g, u_ref = u, g_vec = g, u_vec = u;
      std::vector<float> h_ref(n), h_vec(n);
      const float dot_ref =
          ref::siluBackward(n, 0.3f, dh.data(), g_ref.data(), u_ref.data(), h_ref.data());
      const float dot_vec =
          kernels().siluBackward(n, 0.3f, dh.data(), g_vec.data(), u_vec.data(), h_vec.data());
      const std::string what = " n=" + std::to_string(n) + " |g|<" + std::to_string(bound);
      EXPECT_TRUE(near(h_vec, h_ref, "h" + what));
      EXPECT_TRUE(near(g_vec, g_ref, "dg" + what));
      EXPECT_TRUE(near(u_vec, u_ref, "du" + what));
      double scale = 0;
      for (int64_t i = 0; i < n; ++i) scale += std::abs(dh[i] * h_ref[i]);
      EXPECT_NEAR(dot_vec, dot_ref, 1e-5 * (1.0 + scale)) << "dot" << what;
    }
  }
}

TEST_P(VectorElementwise, AxpyMatchesRef) {
  for (const int64_t n : kLengths) {
    const std::vector<float> x = randomFloats(rng_, n, 1.0f);
    std::vector<float> want = randomFloats(rng_, n + 1, 1.0f), got = want;
    ref::axpy(n, 0.7f, x.data(), want.data());
    kernels().axpy(n, 0.7f, x.data(), got.data());
    EXPECT_TRUE(near(got, want, "axpy n=" + std::to_string(n)));
  }
}

TEST_P(VectorElementwise, WidenBf16MatchesRef) {
  for (const int64_t n : kLengths) {
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) bits[i] = static_cast<uint16_t>(rng_());  // NaN, inf too
    std::vector<float> want(n + 1, -7.0f), got(n + 1, -7.0f);
    ref::widenBf16(n, bits.data(), want.data());
    kernels().widenBf16(n, bits.data(), got.data());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "n=" << n;
  }
}

// Empty on a build without x86 kernels.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(VectorElementwise);
INSTANTIATE_TEST_SUITE_P(Tables, VectorElementwise,
                         ::testing::ValuesIn(testing::vectorTableNames()),
                         testing::vectorTableName);

}  // namespace
}  // namespace tandem::experts::kernels
