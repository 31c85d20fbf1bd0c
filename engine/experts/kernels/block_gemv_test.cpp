// blockGemv (block_gemv.h: one row × Q4_K / Q6_K blocks, int8 activations) against an independent
// reference on ragged shapes: the activations quantised as llama.cpp's quantize_row_q8_K does
// (scale max|x| / 127 per 256, round to nearest even), multiplied in double with W as
// ref::dequantBlocks gives it (ggml's dequantize_row_q4_K / q6_K loops; tests/parity holds those to
// the gguf package); and the fp64 product with the unquantised activations (the int8 error only).
// Also: column splits and accumulate are bitwise one call's result, each sub-block's scale (and
// Q4_K's min) is the one the file gives that sub-block, and the dispatcher (fewRowGemmNT) takes it
// for one row. Runs where the CPU has AVX-512 VNNI (skipped elsewhere).

#include "engine/experts/kernels/block_gemv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/core/ggml_blocks.h"
#include "engine/experts/block_test_util.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels {
namespace {

namespace gb = ggml_blocks;
constexpr int64_t kQK = gb::kQKK;

int64_t blockBytes(WeightType type) {
  return type == WeightType::Q4_K ? static_cast<int64_t>(sizeof(gb::BlockQ4K))
                                  : static_cast<int64_t>(sizeof(gb::BlockQ6K));
}

// y [n] = x's q8_K quantisation · W[j, :] in double (W dequantised by the reference decoder).
std::vector<double> q8KReference(const std::vector<float>& w, int64_t n, int64_t k,
                                 const std::vector<float>& x) {
  std::vector<double> xq(static_cast<size_t>(k));
  for (int64_t b = 0; b < k / kQK; ++b) {
    float amax = 0.0f;
    for (int64_t e = 0; e < kQK; ++e) amax = std::max(amax, std::fabs(x[b * kQK + e]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f, dx = amax / 127.0f;
    for (int64_t e = 0; e < kQK; ++e) {
      xq[b * kQK + e] = static_cast<double>(dx) * std::nearbyint(x[b * kQK + e] * inv);
    }
  }
  std::vector<double> y(static_cast<size_t>(n), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) y[j] += xq[p] * w[j * k + p];
  }
  return y;
}

bool skipHere(WeightType type) { return !hasBlockGemv(type); }

class BlockGemvTest : public ::testing::TestWithParam<WeightType> {};

TEST_P(BlockGemvTest, MatchesTheQ8KReferenceOnRaggedShapes) {
  const WeightType type = GetParam();
  if (skipHere(type)) GTEST_SKIP() << "no AVX-512 VNNI here (or capped by TANDEM_CPU_ISA)";
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  double err = 0.0, norm = 0.0;  // against the fp64 product, over every case (one dot can cancel)
  for (const int64_t k : {int64_t{256}, int64_t{512}, int64_t{1280}}) {
    for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{6}, int64_t{37}}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " n=" + std::to_string(n));
      const int64_t blocks = k / kQK;
      const std::vector<unsigned char> table =
          experts::testing::randomBlocks(type, {}, n * blocks, 1.0f, rng);
      std::vector<float> w(static_cast<size_t>(n * k));
      ref::dequantBlocks(type, {}, table.data(), n * blocks, w.data());
      const BlockWeights view{table.data(), type, {}, n, k, blocks * blockBytes(type)};
      std::vector<float> x(static_cast<size_t>(k));
      for (float& v : x) v = uniform(rng);
      if (k > kQK) std::fill(x.begin() + kQK, x.begin() + 2 * kQK, 0.0f);  // an all-zero block
      const std::vector<double> want = q8KReference(w, n, k, x);
      // a ragged range [n0, n1) into a buffer whose other entries must stay untouched
      const int64_t n0 = n > 2 ? 1 : 0, n1 = n > 5 ? n - 1 : n;
      std::vector<float> y(static_cast<size_t>(n), -7.0f);
      blockGemv(view, n0, n1, x.data(), y.data(), false);
      for (int64_t j = 0; j < n; ++j) {
        if (j < n0 || j >= n1) {
          ASSERT_EQ(y[j], -7.0f) << "row " << j << " is outside [n0, n1)";
          continue;
        }
        ASSERT_NEAR(y[j], want[j],
                    1e-5 * std::sqrt(static_cast<double>(k)) + 1e-5 * std::fabs(want[j]))
            << "row " << j;
        double dense = 0.0;
        for (int64_t p = 0; p < k; ++p) dense += static_cast<double>(x[p]) * w[j * k + p];
        err += (y[j] - dense) * (y[j] - dense);
        norm += dense * dense;
      }
      // every split of the range (threads' column tasks) and accumulate: one call's bits
      for (int64_t cut = n0; cut <= n1; ++cut) {
        std::vector<float> split(y.size(), -7.0f);
        blockGemv(view, n0, cut, x.data(), split.data(), false);
        blockGemv(view, cut, n1, x.data(), split.data(), false);
        ASSERT_EQ(0, std::memcmp(y.data(), split.data(), y.size() * sizeof(float))) << cut;
      }
      std::vector<float> twice = y;
      blockGemv(view, n0, n1, x.data(), twice.data(), true);
      for (int64_t j = n0; j < n1; ++j) ASSERT_FLOAT_EQ(twice[j], 2.0f * y[j]);
      // the dispatcher takes it for one row
      std::vector<float> dispatched(y.size(), -7.0f);
      ASSERT_TRUE(fewRowGemmNT(view, n0, n1, 1, x.data(), k, dispatched.data(), n, false));
      ASSERT_EQ(0, std::memcmp(y.data(), dispatched.data(), y.size() * sizeof(float)));
    }
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-2);  // int8 activations: ~0.5 % of the fp64 product
}

// Q4_K's 12 scale bytes for sc[8], m[8] (6 bits each): the inverse of ggml's get_scale_min_k4.
void packScalesQ4K(const int* sc, const int* m, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

// Each sub-block's scale (and Q4_K's min) distinct, x non-zero on one sub-block at a time: the
// result is that sub-block's dot product only if the kernel reads the scale of that sub-block
// (a scale or min taken from a neighbour, a sign lost on Q6_K's negative scales, or d and dmin
// swapped all fail).
TEST_P(BlockGemvTest, ReadsEachSubBlocksOwnScale) {
  const WeightType type = GetParam();
  if (skipHere(type)) GTEST_SKIP() << "no AVX-512 VNNI here (or capped by TANDEM_CPU_ISA)";
  std::mt19937 rng(32);
  const int64_t n = 5, k = 512, blocks = k / kQK;
  std::vector<unsigned char> table =
      experts::testing::randomBlocks(type, {}, n * blocks, 1.0f, rng);
  const int sub = type == WeightType::Q4_K ? 32 : 16;
  for (int64_t i = 0; i < n * blocks; ++i) {
    unsigned char* blk = table.data() + i * blockBytes(type);
    const int shift = static_cast<int>(i % 3);
    if (type == WeightType::Q4_K) {
      int sc[8], m[8];
      for (int j = 0; j < 8; ++j) {
        sc[j] = 9 + 7 * ((j + shift) % 8);  // 9 .. 58, all different
        m[j] = 60 - 8 * ((j + 2 * shift) % 8);
      }
      packScalesQ4K(sc, m, blk + offsetof(gb::BlockQ4K, scales));
      const uint16_t d = floatToFp16(0.004f), dmin = floatToFp16(0.0011f);
      std::memcpy(blk + offsetof(gb::BlockQ4K, d), &d, 2);
      std::memcpy(blk + offsetof(gb::BlockQ4K, dmin), &dmin, 2);
    } else {
      auto* scales = reinterpret_cast<int8_t*>(blk + offsetof(gb::BlockQ6K, scales));
      for (int j = 0; j < 16; ++j) {
        const int magnitude = 5 + 7 * ((j + shift) % 16);  // 5 .. 110
        scales[j] = static_cast<int8_t>(j % 3 == 1 ? -magnitude : magnitude);
      }
    }
  }
  std::vector<float> w(static_cast<size_t>(n * k));
  ref::dequantBlocks(type, {}, table.data(), n * blocks, w.data());
  const BlockWeights view{table.data(), type, {}, n, k, blocks * blockBytes(type)};
  for (int64_t start = 0; start < k; start += sub) {
    SCOPED_TRACE("sub-block at " + std::to_string(start));
    std::vector<float> x(static_cast<size_t>(k), 0.0f);
    for (int e = 0; e < sub; ++e) x[start + e] = 0.25f + 0.01f * static_cast<float>(e % 5);
    const std::vector<double> want = q8KReference(w, n, k, x);
    std::vector<float> y(static_cast<size_t>(n));
    blockGemv(view, 0, n, x.data(), y.data(), false);
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_NEAR(y[j], want[j], 1e-5 + 1e-5 * std::fabs(want[j])) << "row " << j;
    }
  }
}

TEST_P(BlockGemvTest, RefusesWhatItCannotCompute) {
  const WeightType type = GetParam();
  if (skipHere(type)) GTEST_SKIP() << "no AVX-512 VNNI here (or capped by TANDEM_CPU_ISA)";
  std::vector<float> x(300), y(2);
  const BlockWeights ragged{nullptr, type, {}, 1, 300, 300};
  EXPECT_THROW(blockGemv(ragged, 0, 1, x.data(), y.data(), false), Error);
  EXPECT_FALSE(hasBlockGemv(WeightType::Q8_0));
  const BlockWeights q8{nullptr, WeightType::Q8_0, {}, 1, 256, 272};
  EXPECT_THROW(blockGemv(q8, 0, 1, x.data(), y.data(), false), Error);
}

INSTANTIATE_TEST_SUITE_P(Types, BlockGemvTest,
                         ::testing::Values(WeightType::Q4_K, WeightType::Q6_K),
                         [](const auto& param_info) {
                           return std::string(weightTypeName(param_info.param));
                         });

}  // namespace
}  // namespace tandem::experts::kernels
