// q6kGemmNTAvx512 (Q6_K × int8 activations, block_gemm.h) against two independent references on
// ragged shapes: a scalar q8_K reference written from ggml's dequantize_row_q6_K loop (the same
// quantisation of the activations, integer sums in int64, the f32 scales in double: equal up to
// f32 summation order) and the fp64 product on ref::dequantBlocks' W (the int8 activations' error
// only; tests/parity/test_expert_blocks.py holds ref::dequantBlocks to the gguf package's values).
// Runs where the CPU has AVX-512 (skipped elsewhere, and under TANDEM_CPU_ISA below avx512).

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
#include "engine/experts/kernels/block_gemv.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/few_row_test_util.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {
namespace {

namespace gb = ggml_blocks;

// The signed 6-bit quants (−32..31) and the scale index of the 256 elements of one Q6_K block, in
// ggml's dequantize_row_q6_K order.
void unpackQ6K(const gb::BlockQ6K& blk, int* q, int* scale_index) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = blk.ql + 64 * half;
    const uint8_t* qh = blk.qh + 32 * half;
    for (int l = 0; l < 32; ++l) {
      const int base = 128 * half + l, is = 8 * half + l / 16;
      q[base] = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      q[base + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      q[base + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      q[base + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      scale_index[base] = is;
      scale_index[base + 32] = is + 2;
      scale_index[base + 64] = is + 4;
      scale_index[base + 96] = is + 6;
    }
  }
}

// y [m, n] = the q8_K dot of every row of x with every row of W, as llama.cpp's
// ggml_vec_dot_q6_K_q8_K defines it, in int64 / double.
std::vector<double> scalarQ8KReference(const std::vector<unsigned char>& table, int64_t n,
                                       int64_t k, const float* x, int64_t m, int64_t lda) {
  const int64_t blocks = k / gb::kQKK;
  std::vector<double> y(static_cast<size_t>(m * n), 0.0);
  std::vector<int> qx(static_cast<size_t>(k));
  std::vector<float> dx(static_cast<size_t>(blocks));
  int qw[gb::kQKK], scale_index[gb::kQKK];
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * lda;
    for (int64_t b = 0; b < blocks; ++b) {
      float amax = 0.0f;
      for (int64_t e = 0; e < gb::kQKK; ++e) amax = std::max(amax, std::fabs(xi[b * 256 + e]));
      dx[b] = amax / 127.0f;
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int64_t e = 0; e < gb::kQKK; ++e) {
        qx[b * 256 + e] = static_cast<int>(std::nearbyint(xi[b * 256 + e] * inv));
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t b = 0; b < blocks; ++b) {
        gb::BlockQ6K blk;
        std::memcpy(&blk, table.data() + (j * blocks + b) * sizeof(gb::BlockQ6K), sizeof(blk));
        unpackQ6K(blk, qw, scale_index);
        int64_t dot = 0;
        for (int e = 0; e < gb::kQKK; ++e) {
          dot += static_cast<int64_t>(blk.scales[scale_index[e]]) * qw[e] * qx[b * 256 + e];
        }
        sum += static_cast<double>(dx[b]) * fp16ToFloat(blk.d) * static_cast<double>(dot);
      }
      y[i * n + j] = sum;
    }
  }
  return y;
}

TEST(Q6kFewRows, MatchesTheQ8KReferenceAndFp64OnRaggedShapes) {
  if (!hasFewRowGemmNT(WeightType::Q6_K, 1)) {
    GTEST_SKIP() << "no AVX-512 here (or capped by TANDEM_CPU_ISA)";
  }
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const int64_t k : {int64_t{256}, int64_t{1024}}) {
    const int64_t n = 37, blocks = k / gb::kQKK;
    const int64_t row_bytes = blocks * static_cast<int64_t>(sizeof(gb::BlockQ6K));
    const std::vector<unsigned char> table =
        experts::testing::randomBlocks(WeightType::Q6_K, {}, n * blocks, 1.0f, rng);
    std::vector<float> w(static_cast<size_t>(n * k));
    ref::dequantBlocks(WeightType::Q6_K, {}, table.data(), n * blocks, w.data());
    const BlockWeights view{table.data(), WeightType::Q6_K, {}, n, k, row_bytes};
    for (const int64_t m : {1, 2, 7, 9, 16}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " m=" + std::to_string(m));
      const int64_t lda = k + 5, ldc = n + 3;  // strided rows, as the layer's slices pass them
      std::vector<float> x(static_cast<size_t>(m * lda));
      for (float& v : x) v = uniform(rng);
      if (m > 1) std::fill(x.begin() + lda, x.begin() + lda + 256, 0.0f);  // an all-zero block
      const std::vector<double> want = scalarQ8KReference(table, n, k, x.data(), m, lda);
      std::vector<float> y, dispatched(static_cast<size_t>(m * ldc), -7.0f);
      ASSERT_NO_FATAL_FAILURE(
          testing::expectFewRowKernel(q6kGemmNTAvx512, view, w, want, x, m, lda, ldc, &y));
      // The dispatcher takes it for Q6_K at this row count, with the same result (one row: the
      // one-row kernel, block_gemv_test.cpp; expectFewRowKernel's bounds hold for it too).
      ASSERT_TRUE(fewRowGemmNT(view, 3, n - 2, m, x.data(), lda, dispatched.data(), ldc, false));
      if (m == 1 && hasBlockGemv(WeightType::Q6_K)) {
        const auto one_row = [](const BlockWeights& v, int64_t n0, int64_t n1, int64_t,
                                const float* a, int64_t, float* c, int64_t,
                                bool accumulate) { blockGemv(v, n0, n1, a, c, accumulate); };
        ASSERT_NO_FATAL_FAILURE(
            testing::expectFewRowKernel(one_row, view, w, want, x, m, lda, ldc, &y));
      }
      ASSERT_EQ(0, std::memcmp(y.data(), dispatched.data(), y.size() * sizeof(float)));
    }
  }
  const BlockWeights none{nullptr, WeightType::Q6_K, {}, 1, 256, 210};
  std::vector<float> big(static_cast<size_t>((kFewRowMaxRows + 1) * 256));
  EXPECT_THROW(
      q6kGemmNTAvx512(none, 0, 1, kFewRowMaxRows + 1, big.data(), 256, big.data(), 1, false),
      Error);
  // Past the row limit, or on a type without a few-row kernel, the dispatcher declines.
  EXPECT_FALSE(fewRowGemmNT(none, 0, 1, kFewRowMaxRows + 1, big.data(), 256, big.data(), 1, false));
  const BlockWeights q8{nullptr, WeightType::Q8_0, {}, 1, 256, 272};
  EXPECT_FALSE(fewRowGemmNT(q8, 0, 1, 1, big.data(), 256, big.data(), 1, false));
}

// The bf16 block backends take this path for Q6_K forwards of few rows: the backend's result is
// the kernel's, bitwise (so a Q4_K_M file's Q6_K down projections run it at decode).
TEST(Q6kFewRows, IsTheFewRowForwardOfTheBf16BlockBackends) {
  if (!hasFewRowGemmNT(WeightType::Q6_K, 1)) GTEST_SKIP() << "no AVX-512 here";
  std::mt19937 rng(22);
  const int64_t n = 70, k = 512, m = 5;
  const int64_t row_bytes = k / 256 * static_cast<int64_t>(sizeof(gb::BlockQ6K));
  const std::vector<unsigned char> table =
      experts::testing::randomBlocks(WeightType::Q6_K, {}, n * (k / 256), 1.0f, rng);
  std::vector<float> x(static_cast<size_t>(m * k));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& v : x) v = uniform(rng);
  std::vector<float> want(static_cast<size_t>(m * n));
  q6kGemmNTAvx512({table.data(), WeightType::Q6_K, {}, n, k, row_bytes}, 0, n, m, x.data(), k,
                  want.data(), n, false);
  const int ran =
      testing::expectBlockBackendsTakeTheFewRowKernel(WeightType::Q6_K, table, n, k, m, x, want);
  if (ran == 0) GTEST_SKIP() << "no bf16 block backend here";
}

}  // namespace
}  // namespace tandem::experts::kernels
