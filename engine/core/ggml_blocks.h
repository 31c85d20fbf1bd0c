#pragma once
// ggml's block formats (ggml-common.h) as plain structs, and the reference dequantisation of one
// block of each (ggml-quants.c's dequantize_row_* arithmetic: the same products in the same order,
// each rounded to float). Shared by dequantizeGgml (engine/io/gguf_quant.cpp) and the expert
// engine's kernels on blocks (engine/experts/kernels), which must read the very same bits. A
// translation unit that needs results bit-identical to ggml / gguf-py compiles with
// -ffp-contract=off, so that `d * q - m` is never fused into one rounding.
//
// Blocks in a mapped file are only as aligned as the file: memcpy a block into its struct (the
// structs hold uint16_t fields) before decoding it.

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

#include "engine/core/float_convert.h"

namespace tandem::ggml_blocks {

static_assert(std::endian::native == std::endian::little,
              "ggml blocks are little-endian and are read with memcpy");

inline constexpr int kQK = 32;    // QK4_0, QK4_1, QK5_0, QK5_1, QK8_0, QK4_NL, QK_MXFP4
inline constexpr int kQKK = 256;  // QK_K, the super-block of the K-quants and IQ4_XS
inline constexpr int kKScaleBytes = 12;

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 2 + kQK / 2, "wrong q4_0 block size/padding");
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 4 + kQK / 2, "wrong q4_1 block size/padding");
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 2 + 4 + kQK / 2, "wrong q5_0 block size/padding");
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 4 + 4 + kQK / 2, "wrong q5_1 block size/padding");
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 2 + kQK, "wrong q8_0 block size/padding");
struct BlockMxfp4 {
  uint8_t e;  // E8M0 shared exponent
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockMxfp4) == 1 + kQK / 2, "wrong mxfp4 block size/padding");
struct BlockIq4Nl {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIq4Nl) == 2 + kQK / 2, "wrong iq4_nl block size/padding");

// 16 sub-blocks of 16: 4-bit scale (low nibble) and 4-bit min (high nibble) each.
struct BlockQ2K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2K) == kQKK / 16 + kQKK / 4 + 4, "wrong q2_K block size/padding");
// 16 sub-blocks of 16: 6-bit signed scales packed in 12 bytes; hmask holds the third bit.
struct BlockQ3K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3K) == kQKK / 8 + kQKK / 4 + 12 + 2, "wrong q3_K block size/padding");
// 8 sub-blocks of 32: 6-bit scales and mins packed in 12 bytes (see scaleMinK4).
struct BlockQ4K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ4K) == 4 + kKScaleBytes + kQKK / 2, "wrong q4_K block size/padding");
struct BlockQ5K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ5K) == 4 + kKScaleBytes + kQKK / 8 + kQKK / 2,
              "wrong q5_K block size/padding");
// 16 sub-blocks of 16 with int8 scales; 4 low bits in ql, 2 high bits in qh.
struct BlockQ6K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6K) == kQKK / 2 + kQKK / 4 + kQKK / 16 + 2,
              "wrong q6_K block size/padding");
// The activation format of the K-quant dot products: fp32 scale, bsums unused when dequantizing.
struct BlockQ8K {
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];
};
static_assert(sizeof(BlockQ8K) == 4 + kQKK + kQKK / 16 * 2, "wrong q8_K block size/padding");
// 8 sub-blocks of 32: 6-bit scales, low 4 bits in scales_l, high 2 bits in scales_h.
struct BlockIq4Xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQKK / 64];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockIq4Xs) == 4 + kQKK / 64 + kQKK / 2, "wrong iq4_xs block size/padding");

// The non-linear 4-bit grid of IQ4_NL / IQ4_XS, and the E2M1 values (doubled) of MXFP4.
inline constexpr std::array<int8_t, 16> kIq4NlValues = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                        1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr std::array<int8_t, 16> kMxfp4Values = {0, 1,  2,  3,  4,  6,  8,  12,
                                                        0, -1, -2, -3, -4, -6, -8, -12};

inline float half(uint16_t bits) { return fp16ToFloat(bits); }

// E8M0 exponent to 2^(e-127) / 2, the half compensating for kMxfp4Values being doubled; e < 2
// lands in the subnormals (ggml_e8m0_to_fp32_half).
inline float e8m0ToFloatHalf(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  return floatFromBits(bits);
}

// Scale and min of sub-block j (0-7) from the 12 packed bytes of Q4_K / Q5_K: sub-blocks 0-3 use
// the low 6 bits of bytes j and j+4; 4-7 take their low 4 bits from byte j+4 and their high 2
// bits from the top of bytes j-4 and j.
inline void scaleMinK4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Signed 6-bit scale j (0-15) of Q3_K: low 4 bits from a nibble of bytes 0-7, high 2 bits from
// bytes 8-11, biased by 32.
inline int q3kScale(const uint8_t* scales, int j) {
  const int low = j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4;
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

inline void dequantizeQ4_0(const BlockQ4_0& b, float* y) {
  const float d = half(b.d);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>((b.qs[j] & 0x0F) - 8) * d;
    y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
  }
}

inline void dequantizeQ4_1(const BlockQ4_1& b, float* y) {
  const float d = half(b.d);
  const float m = half(b.m);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(b.qs[j] & 0x0F) * d + m;
    y[j + kQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
  }
}

// Bit j of qh is the fifth bit of element j (0-31).
template <typename Block>
inline int q5Value(const Block& b, uint32_t qh, int j) {
  const int nibble = j < kQK / 2 ? b.qs[j] & 0x0F : b.qs[j - kQK / 2] >> 4;
  return nibble | static_cast<int>(((qh >> j) & 1u) << 4);
}

inline void dequantizeQ5_0(const BlockQ5_0& b, float* y) {
  const float d = half(b.d);
  uint32_t qh;
  std::memcpy(&qh, b.qh, sizeof qh);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q5Value(b, qh, j) - 16) * d;
}

inline void dequantizeQ5_1(const BlockQ5_1& b, float* y) {
  const float d = half(b.d);
  const float m = half(b.m);
  uint32_t qh;
  std::memcpy(&qh, b.qh, sizeof qh);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q5Value(b, qh, j)) * d + m;
}

inline void dequantizeQ8_0(const BlockQ8_0& b, float* y) {
  const float d = half(b.d);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

inline void dequantizeMxfp4(const BlockMxfp4& b, float* y) {
  const float d = e8m0ToFloatHalf(b.e);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(kMxfp4Values[b.qs[j] & 0x0F]) * d;
    y[j + kQK / 2] = static_cast<float>(kMxfp4Values[b.qs[j] >> 4]) * d;
  }
}

inline void dequantizeIq4Nl(const BlockIq4Nl& b, float* y) {
  const float d = half(b.d);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>(kIq4NlValues[b.qs[j] & 0x0F]);
    y[j + kQK / 2] = d * static_cast<float>(kIq4NlValues[b.qs[j] >> 4]);
  }
}

// Each 128-element half uses 32 bytes of qs; shift 0, 2, 4, 6 selects the four 32-element
// quarters, each of which has two 16-element sub-blocks with their own scale and min.
inline void dequantizeQ2K(const BlockQ2K& b, float* y) {
  const float d = half(b.d);
  const float dmin = half(b.dmin);
  int sub_block = 0;
  for (int n = 0; n < kQKK; n += 128) {
    const uint8_t* q = b.qs + n / 4;
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half_quarter = 0; half_quarter < 2; ++half_quarter) {
        const uint8_t sc = b.scales[sub_block++];
        const float dl = d * static_cast<float>(sc & 0xF);
        const float ml = dmin * static_cast<float>(sc >> 4);
        const uint8_t* ql = q + 16 * half_quarter;
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((ql[l] >> shift) & 3) - ml;
      }
    }
  }
}

// As Q2_K for the low two bits; the third bit comes from hmask (bit `m` of byte l selects the
// element, a clear bit subtracts 4), and the 16 scales are signed 6-bit.
inline void dequantizeQ3K(const BlockQ3K& b, float* y) {
  const float d_all = half(b.d);
  int sub_block = 0;
  int hmask_bit = 0;
  for (int n = 0; n < kQKK; n += 128) {
    const uint8_t* q = b.qs + n / 4;
    for (int shift = 0; shift < 8; shift += 2, ++hmask_bit) {
      const uint8_t m = static_cast<uint8_t>(1u << hmask_bit);
      for (int half_quarter = 0; half_quarter < 2; ++half_quarter) {
        const float dl = d_all * static_cast<float>(q3kScale(b.scales, sub_block++));
        const int base = 16 * half_quarter;
        for (int l = 0; l < 16; ++l) {
          const int low = (q[base + l] >> shift) & 3;
          const int value = low - ((b.hmask[base + l] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(value);
        }
      }
    }
  }
}

// Q4_K / Q5_K: the scale and min of sub-blocks 2k and 2k+1 (of 32 elements each).
struct PairScales {
  float d1, m1, d2, m2;
};
inline PairScales pairScalesK4(uint16_t d_half, uint16_t dmin_half, const uint8_t* scales, int k) {
  const float d = half(d_half);
  const float dmin = half(dmin_half);
  uint8_t sc, m;
  scaleMinK4(2 * k, scales, &sc, &m);
  PairScales out{d * static_cast<float>(sc), dmin * static_cast<float>(m), 0, 0};
  scaleMinK4(2 * k + 1, scales, &sc, &m);
  out.d2 = d * static_cast<float>(sc);
  out.m2 = dmin * static_cast<float>(m);
  return out;
}

// 64 elements per 32 bytes of qs: low nibbles are sub-block 2k, high nibbles sub-block 2k+1.
inline void dequantizeQ4K(const BlockQ4K& b, float* y) {
  for (int k = 0; k < kQKK / 64; ++k) {
    const auto [d1, m1, d2, m2] = pairScalesK4(b.d, b.dmin, b.scales, k);
    const uint8_t* q = b.qs + 32 * k;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

// As Q4_K plus a fifth bit: bit 2k of qh[l] for the low nibble, bit 2k+1 for the high one.
inline void dequantizeQ5K(const BlockQ5K& b, float* y) {
  for (int k = 0; k < kQKK / 64; ++k) {
    const auto [d1, m1, d2, m2] = pairScalesK4(b.d, b.dmin, b.scales, k);
    const uint8_t* ql = b.qs + 32 * k;
    const uint8_t u1 = static_cast<uint8_t>(1u << (2 * k));
    const uint8_t u2 = static_cast<uint8_t>(2u << (2 * k));
    for (int l = 0; l < 32; ++l) {
      *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((b.qh[l] & u1) ? 16 : 0)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((b.qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

// Per 128 elements: 64 bytes of ql (low nibbles: elements 0-63, high nibbles 64-127), 32 bytes of
// qh (byte l holds the 2 high bits of elements l, l+32, l+64, l+96), 8 scales (one per 16
// elements). ggml multiplies (d * scale) * q, in that order.
inline void dequantizeQ6K(const BlockQ6K& b, float* y) {
  const float d = half(b.d);
  for (int n = 0; n < kQKK / 128; ++n) {
    const uint8_t* ql = b.ql + 64 * n;
    const uint8_t* qh = b.qh + 32 * n;
    const int8_t* sc = b.scales + 8 * n;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
  }
}

inline void dequantizeQ8K(const BlockQ8K& b, float* y) {
  for (int j = 0; j < kQKK; ++j) y[j] = b.d * static_cast<float>(b.qs[j]);
}

inline void dequantizeIq4Xs(const BlockIq4Xs& b, float* y) {
  const float d = half(b.d);
  for (int ib = 0; ib < kQKK / 32; ++ib) {
    const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    const int high = (b.scales_h >> (2 * ib)) & 3;
    const float dl = d * static_cast<float>((low | (high << 4)) - 32);
    const uint8_t* qs = b.qs + 16 * ib;
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4NlValues[qs[j] & 0xF]);
      y[j + 16] = dl * static_cast<float>(kIq4NlValues[qs[j] >> 4]);
    }
    y += 32;
  }
}

}  // namespace tandem::ggml_blocks
