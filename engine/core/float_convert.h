#pragma once
// bf16 / fp16 / fp8 (e4m3fn, e5m2) <-> fp32 on raw bit patterns, round-to-nearest-even, with
// the same special-value rules as torch (checked exhaustively against it in the test):
//   bf16, fp16: overflow rounds to inf; NaN stays NaN (quiet).
//   fp8 e4m3fn (DeepSeek-V3 / Kimi-K2 weights): no inf; |x| >= 480 (what would round past 448),
//     inf and NaN all become NaN (0x7f, sign kept), as torch.float8_e4m3fn does.
//   fp8 e5m2: overflow to inf, NaN to NaN.
// Scalar and portable: the vector kernels have their own versions and test against these.

#include <cstdint>
#include <cstring>
#include <span>

namespace tandem {

inline uint32_t floatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float floatFromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline float bf16ToFloat(uint16_t bits) { return floatFromBits(static_cast<uint32_t>(bits) << 16); }

inline uint16_t floatToBf16(float value) {
  const uint32_t bits = floatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds half to even in integer arithmetic.
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float fp16ToFloat(uint16_t bits);
uint16_t floatToFp16(float value);
float fp8E4M3ToFloat(uint8_t bits);
uint8_t floatToFp8E4M3(float value);
float fp8E5M2ToFloat(uint8_t bits);
uint8_t floatToFp8E5M2(float value);

// Bulk versions: out.size() must equal in.size().
void bf16ToFloat(std::span<const uint16_t> in, std::span<float> out);
void floatToBf16(std::span<const float> in, std::span<uint16_t> out);
void fp16ToFloat(std::span<const uint16_t> in, std::span<float> out);
void floatToFp16(std::span<const float> in, std::span<uint16_t> out);

}  // namespace tandem
