#pragma once
// Block-weight cases for the kernel tests (block_kernels_test.cpp, bf16_block_backends_test.cpp):
// every block type and int4 variant, random tables with their ref-dequantised values, and the
// relative L2 error the bf16 backends are held to.

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/experts/block_test_util.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels::block_cases {
struct BlockCase {
  WeightType type;
  Int4Spec int4;
  std::string name() const {
    if (type != WeightType::INT4) return std::string(weightTypeName(type));
    return "int4_g" + std::to_string(int4.group) + (int4.symmetric ? "_sym" : "_asym");
  }
};

inline std::vector<BlockCase> allBlockCases() {
  std::vector<BlockCase> cases = {{WeightType::Q8_0, {}}, {WeightType::Q4_0, {}},
                                  {WeightType::Q4_K, {}}, {WeightType::Q5_K, {}},
                                  {WeightType::Q6_K, {}}, {WeightType::IQ4_XS, {}},
                                  {WeightType::MXFP4, {}}};
  for (int group : {32, 64, 128}) {
    for (bool symmetric : {true, false}) cases.push_back({WeightType::INT4, {group, symmetric}});
  }
  return cases;
}

inline std::vector<unsigned char> randomBlocks(const BlockCase& c, int64_t n_blocks,
                                               std::mt19937& rng) {
  return experts::testing::randomBlocks(c.type, c.int4, n_blocks, 1.0f, rng);
}

inline std::vector<float> refDequant(const BlockCase& c, const std::vector<unsigned char>& bytes) {
  const BlockLayout layout = blockLayout(c.type, c.int4);
  const int64_t n_blocks = static_cast<int64_t>(bytes.size()) / layout.bytes;
  std::vector<float> out(static_cast<size_t>(n_blocks * layout.elems));
  ref::dequantBlocks(c.type, c.int4, bytes.data(), n_blocks, out.data());
  return out;
}

// W [rows, cols] of a case, with its ref-dequantised values.
struct RandomWeights {
  std::vector<unsigned char> table;
  std::vector<float> w;
  BlockWeights view(const BlockCase& c, int64_t rows, int64_t cols) const {
    const BlockLayout layout = blockLayout(c.type, c.int4);
    return {table.data(), c.type, c.int4, rows, cols, cols / layout.elems * layout.bytes};
  }
};

inline RandomWeights randomWeights(const BlockCase& c, int64_t rows, int64_t cols,
                                   std::mt19937& rng) {
  RandomWeights out;
  out.table = randomBlocks(c, rows * (cols / blockLayout(c.type, c.int4).elems), rng);
  out.w = refDequant(c, out.table);
  return out;
}

inline std::vector<float> randomActivations(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// ||got − want|| / ||want||: the bf16 backends' measure (bf16 W and activations, fp32 sums).
inline double relativeL2(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

}  // namespace tandem::experts::kernels::block_cases
