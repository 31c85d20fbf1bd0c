#pragma once
// Random block tables for the tests of weights held as blocks (expert_blocks.h): random quants,
// with the scale fields set so the dequantised values are finite and about `bound` in size.

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/core/float_convert.h"
#include "engine/experts/expert_blocks.h"

namespace tandem::experts::testing {

// The largest |quant · sub-scale| a block type reaches: its scale d is bound / this.
inline float blockValueRange(WeightType type) {
  switch (type) {
    case WeightType::Q8_0: return 127.0f;
    case WeightType::Q4_K:
    case WeightType::Q5_K: return 63.0f * 31.0f;
    case WeightType::Q6_K: return 127.0f * 32.0f;
    case WeightType::IQ4_XS: return 32.0f * 127.0f;
    default: return 8.0f;  // Q4_0, INT4
  }
}

// n_blocks random blocks of `type`, values at most about `bound` in magnitude.
inline std::vector<unsigned char> randomBlocks(WeightType type, const Int4Spec& int4,
                                               int64_t n_blocks, float bound, std::mt19937& rng) {
  const BlockLayout layout = blockLayout(type, int4);
  std::vector<unsigned char> bytes(static_cast<size_t>(n_blocks * layout.bytes));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> unit(0.5f, 1.0f);
  for (auto& b : bytes) b = static_cast<unsigned char>(byte(rng));
  std::vector<int> half_fields = {0};  // offsets of the f16 scales in one block
  if (type == WeightType::Q4_K || type == WeightType::Q5_K) half_fields = {0, 2};
  if (type == WeightType::Q6_K) half_fields = {208};
  if (type == WeightType::INT4 && !int4.symmetric) half_fields = {0, 2};
  if (type == WeightType::MXFP4) half_fields = {};
  const float d = bound / blockValueRange(type);
  for (int64_t i = 0; i < n_blocks; ++i) {
    unsigned char* block = bytes.data() + i * layout.bytes;
    for (int offset : half_fields) {
      const uint16_t bits = floatToFp16(d * unit(rng));
      std::memcpy(block + offset, &bits, 2);
    }
    // MXFP4: 2^(e − 128) · 12 ≈ bound.
    if (type == WeightType::MXFP4) {
      const int e = 128 + static_cast<int>(std::floor(std::log2(bound / 12.0f)));
      block[0] = static_cast<unsigned char>(e - byte(rng) % 2);
    }
  }
  return bytes;
}

}  // namespace tandem::experts::testing
