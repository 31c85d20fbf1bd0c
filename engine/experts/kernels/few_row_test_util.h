#pragma once
// The checks every few-row q8_K block kernel (Q4_K by VNNI, Q6_K by AVX-512 BW) passes on one
// row count: columns [3, n − 2) of y [m, ldc] against the kernel's own scalar q8_K reference and
// against the fp64 product with the dequantised weights, the other columns untouched, and a
// column split and accumulate bitwise what one call gives; and the block backends that take the
// kernel below the few-row limit.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels::testing {

// kernel(view, n0, n1, m, x, lda, y, ldc, accumulate); w [n, k] the view's dequantised weights,
// want [m, n] the scalar reference on x [m, lda]. *y_out gets the one-call result.
template <typename Kernel>
void expectFewRowKernel(Kernel kernel, const BlockWeights& view, const std::vector<float>& w,
                        const std::vector<double>& want, const std::vector<float>& x, int64_t m,
                        int64_t lda, int64_t ldc, std::vector<float>* y_out) {
  const int64_t n = view.rows, k = view.cols;
  const int64_t n0 = 3, n1 = n - 2;  // a ragged range; the others must stay untouched
  std::vector<float>& y = *y_out;
  y.assign(static_cast<size_t>(m * ldc), -7.0f);
  kernel(view, n0, n1, m, x.data(), lda, y.data(), ldc, false);
  double err = 0.0, norm = 0.0, fp64_err = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = y[i * ldc + j];
      if (j < n0 || j >= n1) {
        ASSERT_EQ(got, -7.0f) << "column " << j << " is outside [n0, n1)";
        continue;
      }
      const double ref = want[i * n + j];
      ASSERT_NEAR(got, ref, 1e-5 * std::sqrt(static_cast<double>(k)) + 1e-5 * std::fabs(ref))
          << "row " << i << " column " << j;
      double dense = 0.0;
      for (int64_t p = 0; p < k; ++p) dense += static_cast<double>(x[i * lda + p]) * w[j * k + p];
      err += (got - dense) * (got - dense);
      fp64_err += (ref - dense) * (ref - dense);
      norm += dense * dense;
    }
  }
  // int8 activations: ~0.5 % of the fp64 product (1/254 of each block's max per element).
  EXPECT_LT(std::sqrt(err / norm), 1e-2);
  EXPECT_NEAR(std::sqrt(err / norm), std::sqrt(fp64_err / norm), 1e-4);
  // accumulate, and a column split: bitwise what one call gives.
  std::vector<float> split(y.size(), -7.0f);
  kernel(view, n0, 20, m, x.data(), lda, split.data(), ldc, false);
  kernel(view, 20, n1, m, x.data(), lda, split.data(), ldc, false);
  ASSERT_EQ(0, std::memcmp(y.data(), split.data(), y.size() * sizeof(float)));
  kernel(view, n0, n1, m, x.data(), lda, split.data(), ldc, true);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = n0; j < n1; ++j) ASSERT_FLOAT_EQ(split[i * ldc + j], 2.0f * y[i * ldc + j]);
  }
}

// How many of the bf16 block backends this CPU has (avx512_bf16_blocks, amx_blocks) computed
// x [m, k] · Wᵀ for the blocks in `table` (W [n, k] of `type`), each checked bitwise against
// `want` [m, n], the few-row kernel's result: below the few-row limit they must take it.
inline int expectBlockBackendsTakeTheFewRowKernel(WeightType type,
                                                  const std::vector<unsigned char>& table,
                                                  int64_t n, int64_t k, int64_t m,
                                                  const std::vector<float>& x,
                                                  const std::vector<float>& want) {
  const std::vector<std::string> available =
      availableGemmBackends(cpuFeatures(), WeightFormat::Blocks);
  int ran = 0;
  for (const GemmBackend* backend : {avx512Bf16BlocksGemm(), amxBlocksGemm()}) {
    if (!backend ||
        std::find(available.begin(), available.end(), backend->name()) == available.end())
      continue;
    SourceMatrix src;
    src.data = table.data();
    src.type = type;
    src.rows = n;
    src.cols = k;
    const auto packed = backend->pack(src, false, WeightFormat::Blocks, -1);
    std::vector<float> got(want.size(), std::nanf(""));
    backend->gemm(*packed, m, x.data(), k, got.data(), n, false);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
        << backend->name();
    ++ran;
  }
  return ran;
}

}  // namespace tandem::experts::kernels::testing
