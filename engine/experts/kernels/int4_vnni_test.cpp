// int4GemmNTVnni (avx512/int4_dot_avx512_vnni.cpp), the int8 few-row forward on Tandem int4 and
// Q4_0 tables, against an fp64 product of the ref-dequantised W: every group and symmetry, rows
// whose length is not a multiple of the kernel's 128-element chunk, 1..16 rows, a column
// sub-range, accumulate; and the dispatcher (fewRowGemmNT) taking it for those types.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/experts/kernels/block_cases_test_util.h"
#include "engine/experts/kernels/block_gemm.h"

namespace tandem::experts::kernels {
namespace {

using namespace block_cases;  // NOLINT: the shared cases of the block kernel tests

TEST(Int4Vnni, FewRowForwardMatchesFp64) {
  if (!q4kVnniAvailable(cpuFeatures())) GTEST_SKIP() << "no AVX-512 VNNI here";
  std::mt19937 rng(9);
  std::vector<BlockCase> cases = {{WeightType::Q4_0, {}}};
  for (const BlockCase& c : allBlockCases()) {
    if (c.type == WeightType::INT4) cases.push_back(c);
  }
  for (const BlockCase& c : cases) {
    const int64_t group = c.type == WeightType::INT4 ? c.int4.group : 32;
    // 3 and 11 groups: a partial last chunk for groups of 32 and 64; 2048 as the Qwen3 shape.
    for (const int64_t cols : {3 * group, 11 * group, int64_t{2048}}) {
      const int64_t rows = 37;
      const RandomWeights w = randomWeights(c, rows, cols, rng);
      const BlockWeights view = w.view(c, rows, cols);
      for (int64_t m : {1, 5, 8, 9, 16}) {
        SCOPED_TRACE(c.name() + " cols=" + std::to_string(cols) + " m=" + std::to_string(m));
        const std::vector<float> x = randomActivations(m * cols, rng);
        std::vector<double> want(static_cast<size_t>(m * rows), 0.0);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < rows; ++j)
            for (int64_t p = 0; p < cols; ++p)
              want[i * rows + j] += static_cast<double>(x[i * cols + p]) * w.w[j * cols + p];
        // Columns [3, rows − 2) only: the others keep their sentinel.
        std::vector<float> y(static_cast<size_t>(m * rows), -7.0f);
        int4GemmNTVnni(view, 3, rows - 2, m, x.data(), cols, y.data(), rows, false);
        std::vector<float> got;
        std::vector<double> ref;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < rows; ++j) {
            if (j < 3 || j >= rows - 2) {
              ASSERT_EQ(y[i * rows + j], -7.0f) << "wrote outside its columns";
              continue;
            }
            got.push_back(y[i * rows + j]);
            ref.push_back(want[i * rows + j]);
          }
        }
        EXPECT_LT(relativeL2(got, ref), 2e-2);
        // Through the dispatcher, accumulating onto the same product: twice the reference.
        std::vector<float> twice(static_cast<size_t>(m * rows));
        ASSERT_TRUE(fewRowGemmNT(view, 0, rows, m, x.data(), cols, twice.data(), rows, false));
        ASSERT_TRUE(fewRowGemmNT(view, 0, rows, m, x.data(), cols, twice.data(), rows, true));
        std::vector<double> want_twice = want;
        for (double& v : want_twice) v *= 2.0;
        EXPECT_LT(relativeL2(twice, want_twice), 2e-2) << "dispatched, accumulated";
      }
    }
  }
}

}  // namespace
}  // namespace tandem::experts::kernels
