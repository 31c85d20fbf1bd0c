// quantizeGgml against dequantizeGgml: every type round-trips within its step size, all-zero
// blocks stay zero, and bad sizes are errors. tests/cli/test_export_merge.py checks the bytes
// against llama.cpp's llama-quantize (bit for bit).

#include "engine/io/gguf_quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/core/error.h"

namespace tandem::io {
namespace {

std::vector<float> roundTrip(GgmlType type, const std::vector<float>& values) {
  std::vector<std::byte> bytes(ggmlBytes(type, static_cast<int64_t>(values.size())));
  quantizeGgml(type, values, bytes, "test");
  std::vector<float> back(values.size());
  dequantizeGgml(type, bytes, static_cast<int64_t>(values.size()), back.data(), "test");
  return back;
}

// Worst error relative to the block's largest magnitude.
double worstRelativeError(GgmlType type, int block, const std::vector<float>& values) {
  const std::vector<float> back = roundTrip(type, values);
  double worst = 0;
  for (size_t start = 0; start < values.size(); start += block) {
    double amax = 0;
    for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(double(values[start + i])));
    for (int i = 0; i < block; ++i)
      worst = std::max(worst, std::fabs(double(back[start + i]) - values[start + i]) / amax);
  }
  return worst;
}

TEST(GgufQuantize, EveryTypeRoundTripsWithinItsStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> values(4096);
  for (float& v : values) v = normal(rng);
  values[5] = 0.9f;  // an outlier in the first block
  struct Case {
    GgmlType type;
    int block;
    double bound;  // half a step of the coarsest scale, with margin for the scale's own rounding
  };
  for (const Case& c : {Case{GgmlType::F32, 1, 0.0}, Case{GgmlType::F16, 1, 1e-3},
                        Case{GgmlType::BF16, 1, 4e-3}, Case{GgmlType::Q8_0, 32, 0.5 / 127 + 1e-3},
                        Case{GgmlType::Q5_0, 32, 1.0 / 16 + 1e-3},  // -16..15: a full step at +amax
                        Case{GgmlType::Q6_K, 256, 0.5 / 32 * 1.1 + 1e-3},
                        Case{GgmlType::Q4_K, 256, 1.0 / 15 + 1e-2}}) {
    EXPECT_LE(worstRelativeError(c.type, c.block, values), c.bound) << ggmlTypeName(c.type);
  }
}

TEST(GgufQuantize, ZeroBlocksStayZero) {
  const std::vector<float> zeros(512, 0.0f);
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
    for (float v : roundTrip(type, zeros)) ASSERT_EQ(v, 0.0f) << ggmlTypeName(type);
  }
}

TEST(GgufQuantize, RefusesWhatItCannotWrite) {
  std::vector<float> values(100, 1.0f);
  std::vector<std::byte> out(1000);
  EXPECT_THROW(quantizeGgml(GgmlType::Q4_K, values, out, "w"), Error);  // not whole blocks
  EXPECT_THROW(quantizeGgml(GgmlType::IQ2_XS, values, out, "w"), Error);
  EXPECT_FALSE(ggmlQuantizable(GgmlType::Q2_K));
}

}  // namespace
}  // namespace tandem::io
