// compressed-tensors pack-quantized int4 (Kimi-K2's checkpoints) into Tandem int4 tables: the
// values the reference block decoder reads from the repacked table are exactly scale · q of the
// pack-quantized definition (packed here from known q, independently of the code under test), and
// every inconsistency between the three tensors is an Error naming the tensor.

#include "engine/experts/packed_int4.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts {
namespace {

// W [rows, cols] as compressed-tensors packs it: q in [-8, 7], bf16 scales per group of 32.
struct PackedFixture {
  int64_t rows, cols;
  std::vector<int> q;                 // [rows, cols]
  std::vector<uint16_t> scale_bits;   // [rows, ceil(cols / 32)] bf16
  std::vector<int32_t> words;         // [rows, ceil(cols / 8)]
  std::vector<int64_t> shape_values;  // {rows, cols}

  PackedFixture(int64_t r, int64_t c, uint32_t seed) : rows(r), cols(c) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> value(-8, 7);
    std::uniform_real_distribution<float> scale(1e-3f, 5e-2f);
    const int64_t groups = (cols + 31) / 32, width = (cols + 7) / 8;
    for (int64_t i = 0; i < rows * cols; ++i) q.push_back(value(rng));
    for (int64_t i = 0; i < rows * groups; ++i) scale_bits.push_back(floatToBf16(scale(rng)));
    words.assign(static_cast<size_t>(rows * width), 0);
    // pack_to_int32: element c at bit 4 · (c % 8) of word c / 8, stored as q + 8.
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t col = 0; col < cols; ++col) {
        const auto u = static_cast<uint32_t>(q[row * cols + col] + 8);
        auto& word = reinterpret_cast<uint32_t&>(words[row * width + col / 8]);
        word |= u << (4 * (col % 8));
      }
    }
    shape_values = {rows, cols};
  }

  float expected(int64_t row, int64_t col) const {
    const int64_t groups = (cols + 31) / 32;
    return bf16ToFloat(scale_bits[row * groups + col / 32]) *
           static_cast<float>(q[row * cols + col]);
  }

  PackedInt4Weight weight() const {
    auto span = [](const auto& v) { return std::as_bytes(std::span(v.data(), v.size())); };
    PackedInt4Weight w;
    w.packed = {"x.weight_packed", "I32", {rows, (cols + 7) / 8}, span(words)};
    w.scale = {"x.weight_scale", "BF16", {rows, (cols + 31) / 32}, span(scale_bits)};
    w.shape = {"x.weight_shape", "I64", {2}, span(shape_values)};
    return w;
  }
};

TEST(PackedInt4, RepackedTableDecodesToScaleTimesQ) {
  const PackedFixture f(7, 96, 1);
  const Int4Spec spec = packedInt4Spec();
  std::vector<unsigned char> table(blockTableBytes(WeightType::INT4, spec, f.rows, f.cols, "test"));
  repackPackedInt4(f.weight(), f.rows, f.cols, table.data());
  std::vector<float> decoded(static_cast<size_t>(f.rows * f.cols));
  kernels::ref::dequantBlocks(WeightType::INT4, spec, table.data(), f.rows * f.cols / 32,
                              decoded.data());
  for (int64_t r = 0; r < f.rows; ++r) {
    for (int64_t c = 0; c < f.cols; ++c) {
      ASSERT_EQ(decoded[r * f.cols + c], f.expected(r, c)) << "row " << r << " col " << c;
    }
  }
}

TEST(PackedInt4, DequantisedMatchesTheDefinitionWithAPartialLastGroup) {
  const PackedFixture f(3, 44, 2);  // 44 inputs: 6 words (4 values of padding), 2 groups
  std::vector<float> out(static_cast<size_t>(f.rows * f.cols));
  dequantisePackedInt4(f.weight(), f.rows, f.cols, out.data());
  for (int64_t r = 0; r < f.rows; ++r) {
    for (int64_t c = 0; c < f.cols; ++c) ASSERT_EQ(out[r * f.cols + c], f.expected(r, c));
  }
  std::vector<unsigned char> table(1024);
  EXPECT_THROW(repackPackedInt4(f.weight(), f.rows, f.cols, table.data()), Error);
}

// The message of the Error `call` throws (empty when it throws none).
template <typename Call>
std::string errorOf(Call call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PackedInt4, InconsistentTensorsAreRefusedByName) {
  PackedFixture f(4, 64, 3);
  std::vector<unsigned char> table(4 * 2 * 18);
  const auto repack = [&](const PackedInt4Weight& w) {
    return errorOf([&] { repackPackedInt4(w, f.rows, f.cols, table.data()); });
  };
  EXPECT_EQ(repack(f.weight()), "");

  // weight_shape disagreeing with the model's shape.
  f.shape_values = {4, 96};
  EXPECT_NE(repack(f.weight()).find("x.weight_shape says the weight is [4, 96]"),
            std::string::npos);
  f.shape_values = {4, 64};

  // weight_packed of another width than weight_shape implies.
  PackedInt4Weight w = f.weight();
  w.packed.shape = {4, 4};
  w.packed.bytes = w.packed.bytes.first(4 * 4 * 4);
  EXPECT_NE(repack(w).find("x.weight_packed has shape [4, 4]"), std::string::npos) << repack(w);

  // Bytes that do not match the declared shape.
  w = f.weight();
  w.packed.bytes = w.packed.bytes.first(w.packed.bytes.size() - 4);
  EXPECT_NE(repack(w).find("x.weight_packed holds"), std::string::npos) << repack(w);

  // Wrong dtypes.
  w = f.weight();
  w.scale.dtype = "F32";
  EXPECT_NE(repack(w).find("x.weight_scale is F32"), std::string::npos) << repack(w);
  w = f.weight();
  w.packed.dtype = "U32";
  EXPECT_NE(repack(w).find("x.weight_packed is U32"), std::string::npos) << repack(w);

  // A scale f16 cannot hold.
  f.scale_bits[5] = floatToBf16(1e6f);
  EXPECT_NE(repack(f.weight()).find("x.weight_scale: the scale of row 2, group 1"),
            std::string::npos)
      << repack(f.weight());
}

}  // namespace
}  // namespace tandem::experts
