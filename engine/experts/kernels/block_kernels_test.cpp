// The block kernels: ref::dequantBlocks against ggml's own dequantisation (testdata vectors made
// by ggml), every vector table's dequantBlocks against ref, the block GEMMs (forward x Wᵀ and
// input gradient dY W) of every table against an fp64 product of the ref-dequantised W on ragged
// shapes, and the table-size / type checks that stand before any block is read.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/experts/block_test_util.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/block_cases_test_util.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/packed_gemm.h"
#include "engine/experts/kernels/vector_kernels_test_util.h"

namespace tandem::experts::kernels {
namespace {

using namespace block_cases;  // NOLINT: the shared cases of the block kernel tests

TEST(BlockKernels, RefReproducesGgmlVectorsBitForBit) {
  std::ifstream in(std::filesystem::path(TANDEM_IO_TESTDATA_DIR) / "ggml_quant_vectors.txt");
  ASSERT_TRUE(in) << "testdata/ggml_quant_vectors.txt is missing";
  std::string line, type_name;
  std::vector<unsigned char> bytes;
  int checked = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string tag;
    fields >> tag;
    if (tag == "type") {
      fields >> type_name;
    } else if (tag == "bytes") {
      std::string hex;
      fields >> hex;
      bytes.clear();
      for (size_t i = 0; i + 1 < hex.size(); i += 2)
        bytes.push_back(static_cast<unsigned char>(std::stoul(hex.substr(i, 2), nullptr, 16)));
    } else if (tag == "dequant") {
      WeightType type{};
      bool ours = false;
      for (const BlockCase& c : allBlockCases()) {
        std::string lower = type_name;
        for (char& ch : lower) ch = static_cast<char>(std::tolower(ch));
        if (c.type != WeightType::INT4 && c.name() == lower) type = c.type, ours = true;
      }
      if (!ours) continue;
      SCOPED_TRACE(type_name);
      std::vector<float> want;
      std::string number;
      while (fields >> number) want.push_back(std::strtof(number.c_str(), nullptr));
      const std::vector<float> got = refDequant({type, {}}, bytes);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 7) << "every GGUF block type the experts take has a ggml vector";
}

TEST(BlockKernels, TandemInt4RoundTripsWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  const int64_t rows = 5, cols = 256;
  std::vector<float> w(rows * cols);
  for (float& v : w) v = dist(rng);
  for (int group : {32, 64, 128}) {
    for (bool symmetric : {true, false}) {
      const BlockCase c{WeightType::INT4, {group, symmetric}};
      SCOPED_TRACE(c.name());
      std::vector<unsigned char> table(blockTableBytes(c.type, c.int4, rows, cols, "test"));
      quantiseInt4(w.data(), rows, cols, c.int4, table.data());
      const std::vector<float> back = refDequant(c, table);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < cols; g += group) {
          float lo = 1e9f, hi = -1e9f, amax = 0.0f;
          for (int j = 0; j < group; ++j) {
            const float v = w[r * cols + g + j];
            lo = std::min(lo, v), hi = std::max(hi, v), amax = std::max(amax, std::fabs(v));
          }
          const float step = symmetric ? amax / 7.0f : (hi - lo) / 15.0f;
          for (int j = 0; j < group; ++j) {
            const int64_t i = r * cols + g + j;
            // Half a step, plus the f16 rounding of d (and m) carried through |q| ≤ 15.
            ASSERT_LE(std::fabs(back[i] - w[i]),
                      0.5f * step * 1.02f + 2e-3f * std::fabs(lo) + 1e-6f)
                << "element " << i;
          }
        }
      }
    }
  }
}

TEST(BlockKernels, TableSizeAndTypeAreCheckedBeforeAnyRead) {
  const Int4Spec int4{};
  EXPECT_EQ(blockTableBytes(WeightType::Q4_K, int4, 3, 512, "w"), 3u * 2 * 144);
  EXPECT_NO_THROW(checkBlockTable(WeightType::Q4_K, int4, 3, 512, 3 * 2 * 144, "w"));
  try {
    checkBlockTable(WeightType::Q4_K, int4, 3, 512, 3 * 2 * 144 - 1, "expert 2 down_proj");
    FAIL() << "a short table was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert 2 down_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs 864"), std::string::npos) << e.what();
  }
  EXPECT_THROW(blockTableBytes(WeightType::Q4_K, int4, 3, 96, "w"), Error);  // not whole blocks
  EXPECT_THROW(blockTableBytes(WeightType::INT4, {48, true}, 3, 96, "w"), Error);
  try {
    expertWeightTypeOfGgml(10, "q2_K", "blk.0.ffn_up_exps");  // ggml's Q2_K
    FAIL() << "q2_K was accepted";
  } catch (const Error& e) {
    const std::string text = std::string(e.what()) + " " + e.whatToDo();
    EXPECT_NE(text.find("q2_K"), std::string::npos) << text;
    EXPECT_NE(text.find("Q4_K_M"), std::string::npos) << text;
  }
  EXPECT_EQ(expertWeightTypeOfGgml(12, "q4_K", "t"), WeightType::Q4_K);
  EXPECT_EQ(expertFormatName(WeightFormat::Blocks, WeightType::Q6_K), "q6_k");
  EXPECT_EQ(expertFormatName(WeightFormat::Int4, WeightType::INT4), "int4");
}

// Every table: generic (the reference itself, through the GEMMs) and the vector ones.
std::vector<std::string> allTableNames() {
  std::vector<std::string> names = {"generic"};
  for (const std::string& n : testing::vectorTableNames()) names.push_back(n);
  return names;
}

class BlockTables : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "generic") {
      kernels_ = &genericKernels();
      return;
    }
    const testing::VectorTable table = testing::vectorTable(GetParam());
    if (!table.usable) GTEST_SKIP() << "no " << GetParam() << " here (or capped by TANDEM_CPU_ISA)";
    kernels_ = table.kernels;
  }
  const ExpertKernels& kernels() const { return *kernels_; }
  std::mt19937 rng_{11};

 private:
  const ExpertKernels* kernels_ = nullptr;
};

TEST_P(BlockTables, DequantMatchesRef) {
  for (const BlockCase& c : allBlockCases()) {
    SCOPED_TRACE(c.name());
    const std::vector<unsigned char> bytes = randomBlocks(c, 5, rng_);
    const std::vector<float> want = refDequant(c, bytes);
    // Misaligned by one byte, as a block inside a mapped file may be.
    std::vector<unsigned char> shifted(bytes.size() + 1);
    std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
    std::vector<float> got(want.size(), std::nanf(""));
    kernels().dequantBlocks(c.type, c.int4, shifted.data() + 1, 5, got.data());
    for (size_t i = 0; i < got.size(); ++i) {
      // Only a fused d · q − m (K-quant mins, int4 offsets) may differ, in its last bit.
      ASSERT_NEAR(got[i], want[i], 1e-6 * (1.0 + std::fabs(want[i]))) << "element " << i;
    }
  }
}

void expectNear(const std::vector<float>& got, const std::vector<double>& want, int64_t k,
                double w_scale) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol =
        1e-5 * std::sqrt(static_cast<double>(k)) * w_scale + 1e-6 * std::abs(want[i]);
    ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
  }
}

// Ragged: odd token counts, out not a multiple of any tile, several blocks per row.
TEST_P(BlockTables, ForwardAndInputGradientMatchFp64OnRaggedShapes) {
  for (const BlockCase& c : allBlockCases()) {
    const int64_t elems = blockLayout(c.type, c.int4).elems;
    const int64_t rows = 37, cols = elems == 256 ? 512 : 3 * elems;
    const RandomWeights w = randomWeights(c, rows, cols, rng_);
    double w_scale = 0.0;
    for (float v : w.w) w_scale = std::max(w_scale, static_cast<double>(std::fabs(v)));
    for (int64_t m : {1, 7, 33}) {
      SCOPED_TRACE(c.name() + " m=" + std::to_string(m));
      // Forward: y [m, rows] = x [m, cols] · Wᵀ.
      const std::vector<float> x = randomActivations(m * cols, rng_);
      std::vector<double> y_want(static_cast<size_t>(m * rows), 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < rows; ++j)
          for (int64_t p = 0; p < cols; ++p)
            y_want[i * rows + j] += static_cast<double>(x[i * cols + p]) * w.w[j * cols + p];
      std::vector<float> y(static_cast<size_t>(m * rows), std::nanf(""));
      blockGemmNT(kernels(), w.view(c, rows, cols), 0, rows, m, x.data(), cols, y.data(), rows,
                  false);
      expectNear(y, y_want, cols, w_scale);
      // Input gradient: dx [m, cols] = dy [m, rows] · W, also as column ranges that cut blocks.
      const std::vector<float> dy = randomActivations(m * rows, rng_);
      std::vector<double> dx_want(static_cast<size_t>(m * cols), 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < rows; ++p)
          for (int64_t j = 0; j < cols; ++j)
            dx_want[i * cols + j] += static_cast<double>(dy[i * rows + p]) * w.w[p * cols + j];
      std::vector<float> dx(static_cast<size_t>(m * cols), std::nanf(""));
      blockGemmNN(kernels(), w.view(c, rows, cols), 0, cols, m, dy.data(), rows, dx.data(), cols,
                  false);
      expectNear(dx, dx_want, rows, w_scale);
      std::vector<float> dx_split(dx.size(), std::nanf(""));
      for (int64_t n0 = 0; n0 < cols; n0 += 16) {
        blockGemmNN(kernels(), w.view(c, rows, cols), n0, std::min(cols, n0 + 16), m, dy.data(),
                    rows, dx_split.data(), cols, false);
      }
      ASSERT_EQ(0, std::memcmp(dx.data(), dx_split.data(), dx.size() * sizeof(float)))
          << "a column split must be bitwise the unsplit result";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tables, BlockTables, ::testing::ValuesIn(allTableNames()),
                         testing::vectorTableName);

}  // namespace
}  // namespace tandem::experts::kernels