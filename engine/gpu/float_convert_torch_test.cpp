// Exhaustive check of the conversions against torch's: every 16-bit and 8-bit pattern decoded,
// and every one of the 2^32 fp32 patterns encoded. NaNs only need to stay NaN: torch itself
// gives different NaN payloads on its scalar and vector paths.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/float_convert.h"
#include "engine/core/thread_pool.h"

namespace tandem {
namespace {

template <typename Bits>
at::Tensor allPatterns(at::ScalarType as_type) {
  constexpr int64_t n = int64_t{1} << (8 * sizeof(Bits));
  const at::ScalarType int_type = sizeof(Bits) == 2 ? at::kShort : at::kByte;
  return at::arange(n, at::kLong).to(int_type).view(as_type);
}

// Compares float results bit for bit, treating all NaNs as equal.
void expectSameFloats(const float* expected, const float* actual, int64_t n,
                      const std::string& what) {
  for (int64_t i = 0; i < n; ++i) {
    const bool both_nan = std::isnan(expected[i]) && std::isnan(actual[i]);
    if (!both_nan && floatBits(expected[i]) != floatBits(actual[i])) {
      FAIL() << what << ": pattern 0x" << std::hex << i << " torch " << expected[i] << " ours "
             << actual[i];
    }
  }
}

TEST(FloatConvert, DecodeEveryBf16AndFp16Pattern) {
  for (auto [type, name] : {std::pair{at::kBFloat16, "bf16"}, std::pair{at::kHalf, "fp16"}}) {
    const at::Tensor patterns = allPatterns<uint16_t>(type);
    const at::Tensor expected = patterns.to(at::kFloat).contiguous();
    const auto* bits = reinterpret_cast<const uint16_t*>(patterns.data_ptr());
    std::vector<float> ours(patterns.numel());
    for (int64_t i = 0; i < patterns.numel(); ++i) {
      ours[i] = type == at::kBFloat16 ? bf16ToFloat(bits[i]) : fp16ToFloat(bits[i]);
    }
    expectSameFloats(expected.data_ptr<float>(), ours.data(), patterns.numel(), name);
  }
}

TEST(FloatConvert, DecodeEveryFp8Pattern) {
  for (auto [type, name] :
       {std::pair{at::kFloat8_e4m3fn, "fp8 e4m3fn"}, std::pair{at::kFloat8_e5m2, "fp8 e5m2"}}) {
    const at::Tensor patterns = allPatterns<uint8_t>(type);
    const at::Tensor expected = patterns.to(at::kFloat).contiguous();
    const auto* bits = reinterpret_cast<const uint8_t*>(patterns.data_ptr());
    std::vector<float> ours(256);
    for (int i = 0; i < 256; ++i) {
      ours[i] = type == at::kFloat8_e4m3fn ? fp8E4M3ToFloat(bits[i]) : fp8E5M2ToFloat(bits[i]);
    }
    expectSameFloats(expected.data_ptr<float>(), ours.data(), 256, name);
  }
}

struct Encoder {
  const char* name;
  at::ScalarType type;
  std::function<uint32_t(float)> ours;
  std::function<bool(uint32_t)> is_nan;  // on the encoded bits
};

// Encodes all 2^32 fp32 patterns, in chunks, with torch and with ours, in parallel.
TEST(FloatConvert, EncodeEveryFloatPattern) {
  at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const std::vector<Encoder> encoders = {
      {"bf16", at::kBFloat16, [](float f) { return uint32_t{floatToBf16(f)}; },
       [](uint32_t b) { return (b & 0x7fffu) > 0x7f80u; }},
      {"fp16", at::kHalf, [](float f) { return uint32_t{floatToFp16(f)}; },
       [](uint32_t b) { return (b & 0x7fffu) > 0x7c00u; }},
      {"fp8 e4m3fn", at::kFloat8_e4m3fn, [](float f) { return uint32_t{floatToFp8E4M3(f)}; },
       [](uint32_t b) { return (b & 0x7fu) == 0x7fu; }},
      {"fp8 e5m2", at::kFloat8_e5m2, [](float f) { return uint32_t{floatToFp8E5M2(f)}; },
       [](uint32_t b) { return (b & 0x7fu) > 0x7cu; }},
  };
  constexpr int64_t kChunk = int64_t{1} << 24;
  std::vector<uint32_t> input(kChunk);
  ThreadPool& pool = ThreadPool::global();
  for (int64_t start = 0; start < (int64_t{1} << 32); start += kChunk) {
    for (int64_t i = 0; i < kChunk; ++i) input[i] = static_cast<uint32_t>(start + i);
    const at::Tensor floats = at::from_blob(input.data(), {kChunk}, at::kInt).view(at::kFloat);
    for (const Encoder& encoder : encoders) {
      const at::Tensor torch_out = floats.to(encoder.type).contiguous();
      const bool wide = at::elementSize(encoder.type) == 2;
      const void* torch_bits = torch_out.data_ptr();
      std::atomic<int64_t> first_bad{-1};
      pool.parallelFor(0, kChunk, 1 << 18, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const uint32_t theirs = wide ? static_cast<const uint16_t*>(torch_bits)[i]
                                       : static_cast<const uint8_t*>(torch_bits)[i];
          const uint32_t mine = encoder.ours(floatFromBits(input[i]));
          const bool same = mine == theirs || (encoder.is_nan(mine) && encoder.is_nan(theirs));
          if (!same) {
            int64_t expected = -1;
            first_bad.compare_exchange_strong(expected, i);
            return;
          }
        }
      });
      const int64_t bad = first_bad.load();
      if (bad >= 0) {
        const uint32_t pattern = input[bad];
        FAIL() << encoder.name << ": fp32 pattern 0x" << std::hex << pattern << " ("
               << floatFromBits(pattern) << ") ours 0x" << encoder.ours(floatFromBits(pattern));
      }
    }
  }
}

TEST(FloatConvert, BulkMatchesScalar) {
  const std::vector<float> values = {0.0f,     -0.0f, 1.0f,     -2.5f,    3.14159f,
                                     65504.0f, 1e-8f, INFINITY, -INFINITY};
  std::vector<uint16_t> bf(values.size()), half(values.size());
  floatToBf16(values, bf);
  floatToFp16(values, half);
  std::vector<float> back_bf(values.size()), back_half(values.size());
  bf16ToFloat(bf, back_bf);
  fp16ToFloat(half, back_half);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(bf[i], floatToBf16(values[i]));
    EXPECT_EQ(half[i], floatToFp16(values[i]));
    EXPECT_EQ(floatBits(back_bf[i]), floatBits(bf16ToFloat(bf[i])));
    EXPECT_EQ(floatBits(back_half[i]), floatBits(fp16ToFloat(half[i])));
  }
}

}  // namespace
}  // namespace tandem
