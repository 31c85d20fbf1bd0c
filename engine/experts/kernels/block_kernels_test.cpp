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
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/packed_gemm.h"
#include "engine/experts/kernels/vector_kernels_test_util.h"

namespace tandem::experts::kernels {
namespace {

struct BlockCase {
  WeightType type;
  Int4Spec int4;
  std::string name() const {
    if (type != WeightType::INT4) return std::string(weightTypeName(type));
    return "int4_g" + std::to_string(int4.group) + (int4.symmetric ? "_sym" : "_asym");
  }
};

std::vector<BlockCase> allBlockCases() {
  std::vector<BlockCase> cases = {{WeightType::Q8_0, {}}, {WeightType::Q4_0, {}},
                                  {WeightType::Q4_K, {}}, {WeightType::Q5_K, {}},
                                  {WeightType::Q6_K, {}}, {WeightType::IQ4_XS, {}},
                                  {WeightType::MXFP4, {}}};
  for (int group : {32, 64, 128}) {
    for (bool symmetric : {true, false}) cases.push_back({WeightType::INT4, {group, symmetric}});
  }
  return cases;
}

std::vector<unsigned char> randomBlocks(const BlockCase& c, int64_t n_blocks, std::mt19937& rng) {
  return experts::testing::randomBlocks(c.type, c.int4, n_blocks, 1.0f, rng);
}

std::vector<float> refDequant(const BlockCase& c, const std::vector<unsigned char>& bytes) {
  const BlockLayout layout = blockLayout(c.type, c.int4);
  const int64_t n_blocks = static_cast<int64_t>(bytes.size()) / layout.bytes;
  std::vector<float> out(static_cast<size_t>(n_blocks * layout.elems));
  ref::dequantBlocks(c.type, c.int4, bytes.data(), n_blocks, out.data());
  return out;
}

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

// W [rows, cols] of a case, with its ref-dequantised values.
struct RandomWeights {
  std::vector<unsigned char> table;
  std::vector<float> w;
  BlockWeights view(const BlockCase& c, int64_t rows, int64_t cols) const {
    const BlockLayout layout = blockLayout(c.type, c.int4);
    return {table.data(), c.type, c.int4, rows, cols, cols / layout.elems * layout.bytes};
  }
};

RandomWeights randomWeights(const BlockCase& c, int64_t rows, int64_t cols, std::mt19937& rng) {
  RandomWeights out;
  out.table = randomBlocks(c, rows * (cols / blockLayout(c.type, c.int4).elems), rng);
  out.w = refDequant(c, out.table);
  return out;
}

std::vector<float> randomActivations(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
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

// ||got − want|| / ||want||: the bf16 backends' measure (bf16 W and activations, fp32 sums).
double relativeL2(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// avx512_bf16_blocks (block tiles decoded into the avx512_bf16 micro-kernel's bf16 pairs) against
// fp64 on the ref-dequantised W, every block type, ragged shapes: odd token counts, W's rows not a
// multiple of the 64-column chunk, and (second shape) k over several 256-row segments of the input
// gradient and columns over several 256-column spans. Column splits must be bitwise the whole.
TEST(BlockKernels, Avx512Bf16BlocksMatchFp64OnRaggedShapes) {
  const GemmBackend* backend = avx512Bf16BlocksGemm();
  const std::vector<std::string> available =
      availableGemmBackends(cpuFeatures(), WeightFormat::Blocks);
  if (!backend || std::find(available.begin(), available.end(), backend->name()) == available.end())
    GTEST_SKIP() << "no avx512_bf16_blocks here (or capped by TANDEM_CPU_ISA)";
  std::mt19937 rng(5);
  constexpr double kBf16Tol = 2e-2;
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
      const auto fwd = backend->pack(src, false, WeightFormat::Blocks, -1);
      const auto bwd = backend->pack(src, true, WeightFormat::Blocks, -1);
      EXPECT_EQ(fwd->bytes() + bwd->bytes(), 0u) << "W and Wᵀ are views of the table";
      // 1 and 7 rows: the fp32 path below kMinRowsForPairs; 16 and 33: the bf16 pairs.
      for (int64_t m : {1, 7, 16, 33}) {
        SCOPED_TRACE(c.name() + " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                     " m=" + std::to_string(m));
        // Forward: y [m, rows] = x [m, cols] · Wᵀ.
        const std::vector<float> x = randomActivations(m * cols, rng);
        std::vector<double> y_want(static_cast<size_t>(m * rows), 0.0);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < rows; ++j)
            for (int64_t p = 0; p < cols; ++p)
              y_want[i * rows + j] += static_cast<double>(x[i * cols + p]) * w.w[j * cols + p];
        std::vector<float> y(static_cast<size_t>(m * rows), std::nanf(""));
        backend->gemm(*fwd, m, x.data(), cols, y.data(), rows, false);
        EXPECT_LT(relativeL2(y, y_want), kBf16Tol) << "forward";
        // accumulate: y += the same product (twice the reference).
        backend->gemm(*fwd, m, x.data(), cols, y.data(), rows, true);
        std::vector<double> y_twice = y_want;
        for (double& v : y_twice) v *= 2.0;
        EXPECT_LT(relativeL2(y, y_twice), kBf16Tol) << "forward, accumulated";
        // Input gradient: dx [m, cols] = dy [m, rows] · W, whole and as 64-column splits.
        const std::vector<float> dy = randomActivations(m * rows, rng);
        std::vector<double> dx_want(static_cast<size_t>(m * cols), 0.0);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t p = 0; p < rows; ++p)
            for (int64_t j = 0; j < cols; ++j)
              dx_want[i * cols + j] += static_cast<double>(dy[i * rows + p]) * w.w[p * cols + j];
        std::vector<float> dx(static_cast<size_t>(m * cols), std::nanf(""));
        backend->gemm(*bwd, m, dy.data(), rows, dx.data(), cols, false);
        EXPECT_LT(relativeL2(dx, dx_want), kBf16Tol) << "input gradient";
        std::vector<float> dx_split(dx.size(), std::nanf(""));
        for (int64_t n0 = 0; n0 < cols; n0 += backend->columnBlock()) {
          backend->gemmColumns(*bwd, n0, std::min(cols, n0 + backend->columnBlock()), m, dy.data(),
                               rows, dx_split.data(), cols, false);
        }
        ASSERT_EQ(0, std::memcmp(dx.data(), dx_split.data(), dx.size() * sizeof(float)))
            << "a column split must be bitwise the unsplit result";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tables, BlockTables, ::testing::ValuesIn(allTableNames()),
                         testing::vectorTableName);

}  // namespace
}  // namespace tandem::experts::kernels
