#include "engine/core/float_convert.h"

#include <cassert>

namespace tandem {

namespace {

// Rounds a float whose magnitude is below the target's smallest normal into the target's
// subnormal grid: adding a power of two whose ulp equals the target's subnormal step lets the
// FPU do round-to-nearest-even, and the low bits of the sum are the subnormal mantissa.
// (The classic trick of fp16_ieee_from_fp32_value; relies on the default rounding mode.)
uint32_t roundIntoSubnormal(uint32_t magnitude_bits, uint32_t magic_exponent_bits) {
  const float sum = floatFromBits(magnitude_bits) + floatFromBits(magic_exponent_bits);
  return floatBits(sum) - magic_exponent_bits;
}

// Normal-range rounding to a format with `kept` mantissa bits (of fp32's 23): rebias the
// exponent, add half an ulp minus one plus the lowest kept bit (ties to even), shift.
uint32_t roundNormal(uint32_t magnitude_bits, int exponent_bias_delta, int kept) {
  const int dropped = 23 - kept;
  const uint32_t lowest_kept = (magnitude_bits >> dropped) & 1u;
  magnitude_bits += static_cast<uint32_t>(exponent_bias_delta) << 23;
  magnitude_bits += ((1u << (dropped - 1)) - 1u) + lowest_kept;
  return magnitude_bits >> dropped;
}

}  // namespace

float fp16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return floatFromBits(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // Subnormal (or zero): value = mantissa * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return floatFromBits(sign | floatBits(magnitude));
  }
  return floatFromBits(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

uint16_t floatToFp16(float value) {
  const uint32_t bits = floatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  uint32_t result;
  if (magnitude > 0x7f800000u) {
    result = 0x7e00u;  // NaN
  } else if (magnitude >= 0x477ff000u) {
    result = 0x7c00u;  // rounds to 65520 or more: inf
  } else if (magnitude < 0x38800000u) {
    result = roundIntoSubnormal(magnitude, 126u << 23);  // below 2^-14
  } else {
    result = roundNormal(magnitude, 15 - 127, 10);
  }
  return static_cast<uint16_t>(sign | result);
}

float fp8E4M3ToFloat(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t exponent = (bits >> 3) & 0xfu;
  const uint32_t mantissa = bits & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return floatFromBits(sign | 0x7fc00000u);  // only NaN
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-9f;
    return floatFromBits(sign | floatBits(magnitude));
  }
  return floatFromBits(sign | ((exponent + (127 - 7)) << 23) | (mantissa << 20));
}

uint8_t floatToFp8E4M3(float value) {
  const uint32_t bits = floatBits(value);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  uint32_t result;
  if (magnitude >= (1087u << 20)) {
    result = 0x7fu;  // >= 480 (past the 448 + half-ulp boundary), inf or NaN: NaN, no inf in e4m3fn
  } else if (magnitude < (121u << 23)) {
    result = roundIntoSubnormal(magnitude, 141u << 23);  // below 2^-6
  } else {
    result = roundNormal(magnitude, 7 - 127, 3);
  }
  return static_cast<uint8_t>(sign | result);
}

float fp8E5M2ToFloat(uint8_t bits) { return fp16ToFloat(static_cast<uint16_t>(bits) << 8); }

uint8_t floatToFp8E5M2(float value) {
  const uint32_t bits = floatBits(value);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  uint32_t result;
  if (magnitude > 0x7f800000u) {
    result = 0x7fu;  // NaN
  } else if (magnitude >= (143u << 23)) {
    result = 0x7cu;  // >= 2^16: inf (57344 is the largest finite; 61440 rounds to inf)
  } else if (magnitude < (113u << 23)) {
    result = roundIntoSubnormal(magnitude, 134u << 23);  // below 2^-14
  } else {
    result = roundNormal(magnitude, 15 - 127, 2);
  }
  return static_cast<uint8_t>(sign | result);
}

void bf16ToFloat(std::span<const uint16_t> in, std::span<float> out) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = bf16ToFloat(in[i]);
}

void floatToBf16(std::span<const float> in, std::span<uint16_t> out) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = floatToBf16(in[i]);
}

void fp16ToFloat(std::span<const uint16_t> in, std::span<float> out) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = fp16ToFloat(in[i]);
}

void floatToFp16(std::span<const float> in, std::span<uint16_t> out) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = floatToFp16(in[i]);
}

}  // namespace tandem
