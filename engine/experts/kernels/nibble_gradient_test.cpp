// nibbleGemmNNBf16 (avx512_bf16/block_gradient_bf16.cpp), the 4-bit input gradient dY · W with the
// nibbles as bf16 integers and the scales on dY, against an fp64 product of the ref-dequantised W:
// int4 (every group, symmetric and not), Q4_0 and Q4_K; odd row counts (a half-empty last pair),
// several 64-row segments, column windows that start on 32 but not 64, accumulate and a low-rank
// addend. Every 32-column group of the output is checked on its own, so one block's scale or
// offset (Q4_K: one sub-block's 6-bit scale or min) read from the wrong place fails the test even
// when the whole product's error would hide it.

#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/experts/kernels/block_cases_test_util.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {
namespace {

using namespace block_cases;  // NOLINT: the shared cases of the block kernel tests

std::vector<BlockCase> nibbleCases() {
  std::vector<BlockCase> cases = {{WeightType::Q4_0, {}}, {WeightType::Q4_K, {}}};
  for (const BlockCase& c : allBlockCases()) {
    if (c.type == WeightType::INT4) cases.push_back(c);
  }
  return cases;
}

// dx [m, cols] = dy [m, rows] · W (+ z · bt) in fp64, from W's dequantised values.
std::vector<double> gradientFp64(const std::vector<float>& w, int64_t rows, int64_t cols,
                                 const std::vector<float>& dy, int64_t m,
                                 const LowRankAddend* addend) {
  std::vector<double> dx(static_cast<size_t>(m * cols), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = 0; n < rows; ++n) {
      const double a = dy[i * rows + n];
      for (int64_t k = 0; k < cols; ++k) dx[i * cols + k] += a * w[n * cols + k];
    }
    for (int64_t r = 0; addend && r < addend->rank; ++r) {
      for (int64_t k = 0; k < cols; ++k) {
        dx[i * cols + k] +=
            static_cast<double>(addend->z[i * addend->ldz + r]) * addend->bt[r * addend->ldb + k];
      }
    }
  }
  return dx;
}

// Each 32-column group of columns [n0, n1), all rows together, within tol of want.
void expectEveryGroupClose(const std::vector<float>& got, const std::vector<double>& want,
                           int64_t m, int64_t cols, int64_t n0, int64_t n1, double tol) {
  for (int64_t g0 = n0; g0 < n1; g0 += 32) {
    std::vector<float> g;
    std::vector<double> w;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t k = g0; k < std::min(n1, g0 + 32); ++k) {
        g.push_back(got[i * cols + k]);
        w.push_back(want[i * cols + k]);
      }
    }
    ASSERT_LT(relativeL2(g, w), tol) << "columns " << g0 << ".." << g0 + 31;
  }
}

using NibbleKernel = void (*)(const BlockWeights&, int64_t, int64_t, int64_t, const float*, int64_t,
                              float*, int64_t, bool, const LowRankAddend*);

bool haveAmxBlocks() {
  const std::vector<std::string> available =
      availableGemmBackends(cpuFeatures(), WeightFormat::Blocks);
  return std::find(available.begin(), available.end(), "amx_blocks") != available.end();
}

void checkRaggedShapes(NibbleKernel kernel) {
  std::mt19937 rng(17);
  constexpr int64_t kRank = 3;
  for (const BlockCase& c : nibbleCases()) {
    const int64_t elems = blockLayout(c.type, c.int4).elems;
    const int64_t cols = elems == 256 ? 768 : std::max<int64_t>(6 * elems, 384);
    for (const int64_t rows : {int64_t{37}, int64_t{193}}) {  // 1 and 2 segments, odd
      const RandomWeights w = randomWeights(c, rows, cols, rng);
      const BlockWeights view = w.view(c, rows, cols);
      for (const int64_t m : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{13}, int64_t{32}}) {
        SCOPED_TRACE(c.name() + " rows=" + std::to_string(rows) + " m=" + std::to_string(m));
        const std::vector<float> dy = randomActivations(m * rows, rng);
        const std::vector<float> z = randomActivations(m * kRank, rng);
        const std::vector<float> bt = randomActivations(kRank * cols, rng);
        const LowRankAddend addend{z.data(), kRank, bt.data(), cols, kRank};
        const std::vector<double> want = gradientFp64(w.w, rows, cols, dy, m, nullptr);
        const std::vector<double> want_add = gradientFp64(w.w, rows, cols, dy, m, &addend);
        // A window [32, cols − 64): starts on 32, not 64; the rest keeps its sentinel.
        const int64_t n0 = 32, n1 = cols - 64;
        std::vector<float> dx(static_cast<size_t>(m * cols), -7.0f);
        kernel(view, n0, n1, m, dy.data(), rows, dx.data(), cols, false, nullptr);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t k = 0; k < cols; ++k) {
            if (k < n0 || k >= n1) {
              ASSERT_EQ(dx[i * cols + k], -7.0f) << "wrote column " << k;
            }
          }
        }
        expectEveryGroupClose(dx, want, m, cols, n0, n1, 2e-2);
        // Whole width with the addend, then accumulated onto itself.
        kernel(view, 0, cols, m, dy.data(), rows, dx.data(), cols, false, &addend);
        expectEveryGroupClose(dx, want_add, m, cols, 0, cols, 2e-2);
        kernel(view, 0, cols, m, dy.data(), rows, dx.data(), cols, true, &addend);
        std::vector<double> twice = want_add;
        for (double& v : twice) v *= 2.0;
        expectEveryGroupClose(dx, twice, m, cols, 0, cols, 2e-2);
      }
    }
  }
}

TEST(NibbleGradient, MatchesFp64OnRaggedShapes) {
  if (!hasNibbleGemmNN(WeightType::INT4)) GTEST_SKIP() << "no AVX512_BF16 here";
  checkRaggedShapes(nibbleGemmNNBf16);
}

// The AMX-tile variant (amx_blocks' few-row input gradient) on the same cases.
TEST(NibbleGradient, AmxMatchesFp64OnRaggedShapes) {
  if (!haveAmxBlocks()) GTEST_SKIP() << "no AMX here (or capped by TANDEM_CPU_ISA)";
  checkRaggedShapes(nibbleGemmNNAmx);
}

// One block's scale (int4 / Q4_0: d; Q4_K: d, and one sub-block's 6-bit scale and min) changed in
// the table: the kernel's output follows the new reference in that block's columns, which moved
// by far more than the tolerance. A kernel reading that scale from another block, or a Q4_K
// scale / min from another sub-block, fails here.
TEST(NibbleGradient, FollowsEveryChangedScale) {
  if (!hasNibbleGemmNN(WeightType::INT4)) GTEST_SKIP() << "no AVX512_BF16 here";
  std::mt19937 rng(23);
  for (const BlockCase& c : nibbleCases()) {
    const BlockLayout layout = blockLayout(c.type, c.int4);
    const int64_t rows = 21, cols = layout.elems == 256 ? 512 : 4 * layout.elems, m = 5;
    RandomWeights w = randomWeights(c, rows, cols, rng);
    const std::vector<float> dy = randomActivations(m * rows, rng);
    const std::vector<double> before = gradientFp64(w.w, rows, cols, dy, m, nullptr);
    // Block 1 of row 6: its first scale × 4 (f16 d at its head; Q4_K: also sub-block 3's 6-bit
    // scale and min, bytes 4 + 3 and 4 + 7 of its scales, low 6 bits).
    const int64_t row_bytes = cols / layout.elems * layout.bytes;
    unsigned char* block = w.table.data() + 6 * row_bytes + layout.bytes;
    uint16_t d_bits;
    std::memcpy(&d_bits, block, 2);
    const float d = _cvtsh_ss(d_bits) * 4.0f;
    d_bits = _cvtss_sh(d, 0);
    std::memcpy(block, &d_bits, 2);
    if (c.type == WeightType::Q4_K) {
      block[4 + 3] = static_cast<unsigned char>((block[4 + 3] & 0xC0) | 61);
      block[4 + 7] = static_cast<unsigned char>((block[4 + 7] & 0xC0) | 5);
    }
    w.w = refDequant(c, w.table);
    const std::vector<double> after = gradientFp64(w.w, rows, cols, dy, m, nullptr);
    std::vector<float> moved(after.begin(), after.end());
    SCOPED_TRACE(c.name());
    ASSERT_GT(relativeL2(moved, before), 0.05) << "the change must matter to the reference";
    std::vector<float> dx(static_cast<size_t>(m * cols));
    nibbleGemmNNBf16(w.view(c, rows, cols), 0, cols, m, dy.data(), rows, dx.data(), cols, false);
    expectEveryGroupClose(dx, after, m, cols, 0, cols, 2e-2);
  }
}

}  // namespace
}  // namespace tandem::experts::kernels
