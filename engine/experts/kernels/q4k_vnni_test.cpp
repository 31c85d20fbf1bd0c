// q4kGemmNTVnni (Q4_K × int8 activations by vpdpbusd, block_gemm.h) against two independent
// references on ragged shapes: a scalar q8_K reference (the same quantisation of the activations,
// integer sums in int64, the f32 scales in double: equal up to f32 summation order) and the fp64
// product on ref::dequantBlocks' W (the int8 activations' error only). Runs where the CPU has
// AVX-512 VNNI (skipped elsewhere, and under TANDEM_CPU_ISA below avx512).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/core/ggml_blocks.h"
#include "engine/experts/block_test_util.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/few_row_test_util.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {
namespace {

namespace gb = ggml_blocks;

// y [m, n] (row stride ldy) = the q8_K dot of every row of x with every row of W, as llama.cpp's
// ggml_vec_dot_q4_K_q8_K defines it, in int64 / double.
std::vector<double> scalarQ8KReference(const std::vector<unsigned char>& table, int64_t n,
                                       int64_t k, const float* x, int64_t m, int64_t lda) {
  const int64_t blocks = k / gb::kQKK;
  std::vector<double> y(static_cast<size_t>(m * n), 0.0);
  std::vector<int> q(static_cast<size_t>(k));
  std::vector<float> dx(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * lda;
    for (int64_t b = 0; b < blocks; ++b) {
      float amax = 0.0f;
      for (int64_t e = 0; e < gb::kQKK; ++e) amax = std::max(amax, std::fabs(xi[b * 256 + e]));
      dx[b] = amax / 127.0f;
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int64_t e = 0; e < gb::kQKK; ++e) {
        q[b * 256 + e] = static_cast<int>(std::nearbyint(xi[b * 256 + e] * inv));
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      const auto* row = reinterpret_cast<const gb::BlockQ4K*>(table.data()) + j * blocks;
      double sum = 0.0;
      for (int64_t b = 0; b < blocks; ++b) {
        int64_t scaled = 0, mins = 0;
        for (int s = 0; s < 8; ++s) {
          uint8_t sc = 0, mn = 0;
          gb::scaleMinK4(s, row[b].scales, &sc, &mn);
          int64_t dot = 0, qsum = 0;
          for (int e = 0; e < 32; ++e) {
            const uint8_t byte = row[b].qs[32 * (s / 2) + e];
            const int nibble = s % 2 ? byte >> 4 : byte & 0xF;
            dot += nibble * q[b * 256 + 32 * s + e];
            qsum += q[b * 256 + 32 * s + e];
          }
          scaled += sc * dot;
          mins += mn * qsum;
        }
        sum += static_cast<double>(dx[b]) * (static_cast<double>(fp16ToFloat(row[b].d)) * scaled -
                                             static_cast<double>(fp16ToFloat(row[b].dmin)) * mins);
      }
      y[i * n + j] = sum;
    }
  }
  return y;
}

TEST(Q4kVnni, MatchesTheQ8KReferenceAndFp64OnRaggedShapes) {
  if (!q4kVnniAvailable(cpuFeatures())) {
    GTEST_SKIP() << "no AVX-512 VNNI here (or capped by TANDEM_CPU_ISA)";
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const int64_t k : {int64_t{256}, int64_t{768}}) {
    const int64_t n = 37, blocks = k / gb::kQKK;
    const std::vector<unsigned char> table =
        experts::testing::randomBlocks(WeightType::Q4_K, {}, n * blocks, 1.0f, rng);
    std::vector<float> w(static_cast<size_t>(n * k));
    ref::dequantBlocks(WeightType::Q4_K, {}, table.data(), n * blocks, w.data());
    const BlockWeights view{table.data(), WeightType::Q4_K, {}, n, k, blocks * 144};
    for (const int64_t m : {1, 2, 7, 15, 16}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " m=" + std::to_string(m));
      const int64_t lda = k + 5, ldc = n + 3;  // strided rows, as the layer's slices pass them
      std::vector<float> x(static_cast<size_t>(m * lda));
      for (float& v : x) v = uniform(rng);
      if (m > 1) std::fill(x.begin() + lda, x.begin() + lda + 256, 0.0f);  // an all-zero block
      const std::vector<double> want = scalarQ8KReference(table, n, k, x.data(), m, lda);
      std::vector<float> y;
      ASSERT_NO_FATAL_FAILURE(
          testing::expectFewRowKernel(q4kGemmNTVnni, view, w, want, x, m, lda, ldc, &y));
    }
  }
  const BlockWeights none{nullptr, WeightType::Q4_K, {}, 1, 256, 144};
  std::vector<float> big(static_cast<size_t>((kQ4kVnniMaxRows + 1) * 256));
  EXPECT_THROW(
      q4kGemmNTVnni(none, 0, 1, kQ4kVnniMaxRows + 1, big.data(), 256, big.data(), 1, false), Error);
}

// The bf16 block backends take this path for Q4_K forwards of few rows: the backend's result is
// the kernel's, bitwise (so the layer's 128-token case runs it, not the f32 decode).
TEST(Q4kVnni, IsTheFewRowForwardOfTheBf16BlockBackends) {
  if (!q4kVnniAvailable(cpuFeatures())) GTEST_SKIP() << "no AVX-512 VNNI here";
  std::mt19937 rng(12);
  const int64_t n = 70, k = 512, m = 7;
  const std::vector<unsigned char> table =
      experts::testing::randomBlocks(WeightType::Q4_K, {}, n * (k / 256), 1.0f, rng);
  std::vector<float> x(static_cast<size_t>(m * k));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& v : x) v = uniform(rng);
  std::vector<float> want(static_cast<size_t>(m * n));
  q4kGemmNTVnni({table.data(), WeightType::Q4_K, {}, n, k, k / 256 * 144}, 0, n, m, x.data(), k,
                want.data(), n, false);
  const int ran =
      testing::expectBlockBackendsTakeTheFewRowKernel(WeightType::Q4_K, table, n, k, m, x, want);
  if (ran == 0) GTEST_SKIP() << "no bf16 block backend here";
}

}  // namespace
}  // namespace tandem::experts::kernels
