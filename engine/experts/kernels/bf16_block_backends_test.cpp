// The bf16 block backends, amx_blocks and avx512_bf16_blocks, against an fp64 product of the
// ref-dequantised W: every block type, ragged shapes, forward (x Wᵀ) and input gradient (dY W)
// read from the one table, with and without accumulate and a low-rank addend, column splits
// bitwise the whole. And the bf16 row decoder that feeds them against ref. A backend this CPU
// lacks (amx_blocks off AMX machines) is skipped with a message.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/core/float_convert.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/block_cases_test_util.h"
#include "engine/experts/kernels/block_decode_bf16.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {
namespace {

using namespace block_cases;  // NOLINT: the shared cases of the block kernel tests

constexpr double kBf16Tol = 2e-2;

// Every element within bf16's rounding (2^-8 relative) of ref, misaligned tables included: a
// scale or min read from the wrong byte is off by far more.
TEST(Bf16BlockDecode, MatchesRefWithinBf16Rounding) {
  if (!cpuFeatures().canUseAvx512Bf16()) GTEST_SKIP() << "no AVX512_BF16 here";
  std::mt19937 rng(3);
  for (const BlockCase& c : allBlockCases()) {
    SCOPED_TRACE(c.name());
    const std::vector<unsigned char> bytes = randomBlocks(c, 5, rng);
    const std::vector<float> want = refDequant(c, bytes);
    std::vector<unsigned char> shifted(bytes.size() + 1);
    std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
    std::vector<uint16_t> got(want.size(), 0xffff);
    dequantBlocksBf16(c.type, c.int4, shifted.data() + 1, 5, got.data());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(bf16ToFloat(got[i]), want[i], std::ldexp(std::fabs(want[i]), -8) + 1e-30)
          << "element " << i;
    }
  }
}

class Bf16BlockBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    for (const GemmBackend* b : {amxBlocksGemm(), avx512Bf16BlocksGemm()}) {
      if (b && GetParam() == b->name()) backend_ = b;
    }
    const std::vector<std::string> available =
        availableGemmBackends(cpuFeatures(), WeightFormat::Blocks);
    if (!backend_ || std::find(available.begin(), available.end(), GetParam()) == available.end()) {
      GTEST_SKIP() << "no " << GetParam() << " here (or capped by TANDEM_CPU_ISA)";
    }
  }
  const GemmBackend* backend_ = nullptr;
};

// c [m, n] = a [m, k] · B (b_at(p, j)) + z · bt in fp64.
template <typename BAt>
std::vector<double> reference(const std::vector<float>& a, int64_t m, int64_t k, int64_t n,
                              BAt b_at, const LowRankAddend* addend) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      const double av = a[i * k + p];
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += av * b_at(p, j);
    }
    if (!addend) continue;
    for (int64_t r = 0; r < addend->rank; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        c[i * n + j] +=
            static_cast<double>(addend->z[i * addend->ldz + r]) * addend->bt[r * addend->ldb + j];
      }
    }
  }
  return c;
}

// One direction of one case: c = a · B (+ addend) whole, accumulated, and as column splits.
void checkProduct(const GemmBackend& backend, const PackedMatrix& b, const std::vector<float>& a,
                  int64_t m, const std::vector<double>& want, const LowRankAddend* addend,
                  const char* what) {
  SCOPED_TRACE(what);
  const int64_t n = b.n(), k = b.k();
  std::vector<float> c(static_cast<size_t>(m * n), std::nanf(""));
  backend.gemm(b, m, a.data(), k, c.data(), n, false, addend);
  EXPECT_LT(relativeL2(c, want), kBf16Tol);
  std::vector<float> split(c.size(), std::nanf(""));
  for (int64_t n0 = 0; n0 < n; n0 += backend.columnBlock()) {
    backend.gemmColumns(b, n0, std::min(n, n0 + backend.columnBlock()), m, a.data(), k,
                        split.data(), n, false, addend);
  }
  ASSERT_EQ(0, std::memcmp(c.data(), split.data(), c.size() * sizeof(float)))
      << "a column split must be bitwise the unsplit result";
  backend.gemm(b, m, a.data(), k, c.data(), n, true, addend);  // c += the same product
  std::vector<double> twice = want;
  for (double& v : twice) v *= 2.0;
  EXPECT_LT(relativeL2(c, twice), kBf16Tol) << "accumulated";
}

// Ragged: W's rows not a multiple of 32 or 64, odd token counts (1 and 7: the few-row paths; 16,
// 33, 70: one, two and three 32-row blocks), and (second shape) W's rows over several 256-row
// segments and its columns over several 256-column spans of the input gradient.
TEST_P(Bf16BlockBackend, MatchesFp64OnRaggedShapes) {
  std::mt19937 rng(5);
  constexpr int64_t kRank = 3;
  for (const BlockCase& c : allBlockCases()) {
    const int64_t elems = blockLayout(c.type, c.int4).elems;
    const int64_t wide_cols = elems == 256 ? 512 : (elems == 128 ? 384 : 9 * elems);
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{37, elems == 256 ? 256 : 3 * elems},
          std::pair<int64_t, int64_t>{301, wide_cols}}) {
      const RandomWeights w = randomWeights(c, rows, cols, rng);
      SourceMatrix src;
      src.data = w.table.data();
      src.type = c.type;
      src.int4 = c.int4;
      src.rows = rows;
      src.cols = cols;
      const auto fwd = backend_->pack(src, false, WeightFormat::Blocks, -1);
      const auto bwd = backend_->pack(src, true, WeightFormat::Blocks, -1);
      EXPECT_EQ(fwd->bytes() + bwd->bytes(), 0u) << "W and Wᵀ are views of the table";
      for (int64_t m : {1, 7, 16, 33, 70}) {
        SCOPED_TRACE(c.name() + " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                     " m=" + std::to_string(m));
        // Forward: y [m, rows] = x [m, cols] · Wᵀ (+ z [m, r] · bt [r, rows]).
        const std::vector<float> x = randomActivations(m * cols, rng);
        const std::vector<float> z = randomActivations(m * kRank, rng);
        const std::vector<float> bt_fwd = randomActivations(kRank * rows, rng);
        const LowRankAddend add_fwd{z.data(), kRank, bt_fwd.data(), rows, kRank};
        const auto w_t = [&](int64_t p, int64_t j) { return w.w[j * cols + p]; };
        checkProduct(*backend_, *fwd, x, m, reference(x, m, cols, rows, w_t, nullptr), nullptr,
                     "forward");
        checkProduct(*backend_, *fwd, x, m, reference(x, m, cols, rows, w_t, &add_fwd), &add_fwd,
                     "forward + addend");
        // Input gradient: dx [m, cols] = dy [m, rows] · W (+ z · bt [r, cols]).
        const std::vector<float> dy = randomActivations(m * rows, rng);
        const std::vector<float> bt_bwd = randomActivations(kRank * cols, rng);
        const LowRankAddend add_bwd{z.data(), kRank, bt_bwd.data(), cols, kRank};
        const auto w_n = [&](int64_t p, int64_t j) { return w.w[p * cols + j]; };
        checkProduct(*backend_, *bwd, dy, m, reference(dy, m, rows, cols, w_n, nullptr), nullptr,
                     "input gradient");
        checkProduct(*backend_, *bwd, dy, m, reference(dy, m, rows, cols, w_n, &add_bwd), &add_bwd,
                     "input gradient + addend");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Bf16BlockBackend,
                         ::testing::Values("amx_blocks", "avx512_bf16_blocks"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           return param.param;
                         });

}  // namespace
}  // namespace tandem::experts::kernels
