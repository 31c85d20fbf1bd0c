// dequantBlocksAvx512: tiles of block weights to f32, 16 lanes at a time (AVX-512 F/BW/VL/DQ +
// FMA). Same values as ref::dequantBlocks up to the rounding of a fused d · q − m (the K-quants'
// mins), which the kernel tests bound. Types without a vector version here (none today beyond
// those below) go through the reference.

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined operands.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

#include "engine/core/float_convert.h"
#include "engine/core/ggml_blocks.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels {

namespace {

namespace gb = ggml_blocks;

// 16 bytes → 16 lanes of their low / high nibbles as f32.
__m512 lowNibbles(__m128i bytes) {
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_cvtepu8_epi32(bytes), _mm512_set1_epi32(0xF)));
}
__m512 highNibbles(__m128i bytes) {
  return _mm512_cvtepi32_ps(_mm512_srli_epi32(_mm512_cvtepu8_epi32(bytes), 4));
}
__m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// f16 → f32 in a register (vcvtph2ps, AVX-512F; exact, as fp16ToFloat), inlined where the
// library's fp16ToFloat is a call.
float halfToFloat(uint16_t bits) {
  return _mm512_cvtss_f32(_mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(bits))));
}

uint16_t loadU16(const unsigned char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Tandem int4 and Q4_0 (= int4 symmetric, group 32): d · (q − 8) (exact, as ref) or d · q + m
// (one fused rounding).
void dequantInt4(const unsigned char* block, int64_t n_blocks, int group, bool symmetric,
                 int64_t block_bytes, float* out) {
  const int half_group = group / 2;
  const __m512 eight = _mm512_set1_ps(8.0f);
  for (int64_t i = 0; i < n_blocks; ++i, block += block_bytes, out += group) {
    const __m512 d = _mm512_set1_ps(halfToFloat(loadU16(block)));
    const __m512 m = _mm512_set1_ps(symmetric ? 0.0f : halfToFloat(loadU16(block + 2)));
    const uint8_t* qs = block + (symmetric ? 2 : 4);
    for (int c = 0; c < half_group; c += 16) {
      const __m128i bytes = load16(qs + c);
      const __m512 lo = lowNibbles(bytes), hi = highNibbles(bytes);
      if (symmetric) {
        _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_sub_ps(lo, eight), d));
        _mm512_storeu_ps(out + half_group + c, _mm512_mul_ps(_mm512_sub_ps(hi, eight), d));
      } else {
        _mm512_storeu_ps(out + c, _mm512_fmadd_ps(lo, d, m));
        _mm512_storeu_ps(out + half_group + c, _mm512_fmadd_ps(hi, d, m));
      }
    }
  }
}

void dequantQ8_0(const unsigned char* block, int64_t n_blocks, float* out) {
  for (int64_t i = 0; i < n_blocks; ++i, block += sizeof(gb::BlockQ8_0), out += gb::kQK) {
    const __m512 d = _mm512_set1_ps(fp16ToFloat(loadU16(block)));
    for (int c = 0; c < gb::kQK; c += 16) {
      const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(block + 2 + c)));
      _mm512_storeu_ps(out + c, _mm512_mul_ps(q, d));
    }
  }
}

// Q4_K / Q5_K: 4 chunks of 64 elements, each two sub-blocks of 32 with their own scale and min;
// Q5_K's fifth bit is bit 2k (low nibbles) / 2k+1 (high nibbles) of qh[l].
template <bool kFiveBits, typename Block>
void dequantK4(const unsigned char* bytes, int64_t n_blocks, float* out) {
  for (int64_t i = 0; i < n_blocks; ++i, bytes += sizeof(Block)) {
    Block b;
    std::memcpy(&b, bytes, sizeof b);
    // pairScalesK4's products, with d and dmin widened once per block in a register instead of per
    // 64 elements: the scalar widening cost ~10 % of a decode-bound step.
    const float d = halfToFloat(b.d), dmin = halfToFloat(b.dmin);
    for (int k = 0; k < gb::kQKK / 64; ++k, out += 64) {
      uint8_t sc1, mn1, sc2, mn2;
      gb::scaleMinK4(2 * k, b.scales, &sc1, &mn1);
      gb::scaleMinK4(2 * k + 1, b.scales, &sc2, &mn2);
      const __m512 d1 = _mm512_set1_ps(d * static_cast<float>(sc1));
      const __m512 m1 = _mm512_set1_ps(dmin * static_cast<float>(mn1));
      const __m512 d2 = _mm512_set1_ps(d * static_cast<float>(sc2));
      const __m512 m2 = _mm512_set1_ps(dmin * static_cast<float>(mn2));
      const uint8_t* q = b.qs + 32 * k;
      for (int c = 0; c < 32; c += 16) {
        const __m128i bytes16 = load16(q + c);
        __m512 lo = lowNibbles(bytes16), hi = highNibbles(bytes16);
        if constexpr (kFiveBits) {
          const __m512i qh = _mm512_cvtepu8_epi32(load16(b.qh + c));
          const __mmask16 lo_bit = _mm512_test_epi32_mask(qh, _mm512_set1_epi32(1 << (2 * k)));
          const __mmask16 hi_bit = _mm512_test_epi32_mask(qh, _mm512_set1_epi32(2 << (2 * k)));
          lo = _mm512_mask_add_ps(lo, lo_bit, lo, _mm512_set1_ps(16.0f));
          hi = _mm512_mask_add_ps(hi, hi_bit, hi, _mm512_set1_ps(16.0f));
        }
        _mm512_storeu_ps(out + c, _mm512_fmsub_ps(lo, d1, m1));
        _mm512_storeu_ps(out + 32 + c, _mm512_fmsub_ps(hi, d2, m2));
      }
    }
  }
}

// Q6_K: per 128 elements, q = (4 bits of ql) | (2 bits of qh) << 4, minus 32, times d · scale.
void dequantQ6K(const unsigned char* bytes, int64_t n_blocks, float* out) {
  for (int64_t i = 0; i < n_blocks; ++i, bytes += sizeof(gb::BlockQ6K)) {
    gb::BlockQ6K b;
    std::memcpy(&b, bytes, sizeof b);
    const float d = fp16ToFloat(b.d);
    for (int n = 0; n < gb::kQKK / 128; ++n, out += 128) {
      const uint8_t* ql = b.ql + 64 * n;
      const uint8_t* qh = b.qh + 32 * n;
      const int8_t* sc = b.scales + 8 * n;
      for (int l = 0; l < 32; l += 16) {
        const __m512i low_a = _mm512_cvtepu8_epi32(load16(ql + l));
        const __m512i low_b = _mm512_cvtepu8_epi32(load16(ql + l + 32));
        const __m512i high = _mm512_cvtepu8_epi32(load16(qh + l));
        const __m512i nib = _mm512_set1_epi32(0xF), two = _mm512_set1_epi32(3);
        const __m512i bias = _mm512_set1_epi32(32);
        const auto value = [&](__m512i low4, int shift) {
          const __m512i hi2 = _mm512_and_si512(_mm512_srli_epi32(high, shift), two);
          return _mm512_cvtepi32_ps(
              _mm512_sub_epi32(_mm512_or_si512(low4, _mm512_slli_epi32(hi2, 4)), bias));
        };
        const int is = l / 16;
        const __m512 q1 = value(_mm512_and_si512(low_a, nib), 0);
        const __m512 q2 = value(_mm512_and_si512(low_b, nib), 2);
        const __m512 q3 = value(_mm512_srli_epi32(low_a, 4), 4);
        const __m512 q4 = value(_mm512_srli_epi32(low_b, 4), 6);
        _mm512_storeu_ps(out + l, _mm512_mul_ps(_mm512_set1_ps(d * sc[is]), q1));
        _mm512_storeu_ps(out + l + 32, _mm512_mul_ps(_mm512_set1_ps(d * sc[is + 2]), q2));
        _mm512_storeu_ps(out + l + 64, _mm512_mul_ps(_mm512_set1_ps(d * sc[is + 4]), q3));
        _mm512_storeu_ps(out + l + 96, _mm512_mul_ps(_mm512_set1_ps(d * sc[is + 6]), q4));
      }
    }
  }
}

// A 16-entry codebook (IQ4_XS's non-linear grid, MXFP4's doubled E2M1 values) as f32 lanes,
// indexed by nibbles with one permute.
__m512 codebook(const int8_t* values) {
  alignas(64) float table[16];
  for (int j = 0; j < 16; ++j) table[j] = static_cast<float>(values[j]);
  return _mm512_load_ps(table);
}

void lookupNibbles(__m512 table, const uint8_t* qs, __m512 scale, float* lo_out, float* hi_out) {
  const __m512i bytes = _mm512_cvtepu8_epi32(load16(qs));
  const __m512i lo = _mm512_and_si512(bytes, _mm512_set1_epi32(0xF));
  const __m512i hi = _mm512_srli_epi32(bytes, 4);
  _mm512_storeu_ps(lo_out, _mm512_mul_ps(scale, _mm512_permutexvar_ps(lo, table)));
  _mm512_storeu_ps(hi_out, _mm512_mul_ps(scale, _mm512_permutexvar_ps(hi, table)));
}

void dequantIq4Xs(const unsigned char* bytes, int64_t n_blocks, float* out) {
  const __m512 table = codebook(gb::kIq4NlValues.data());
  for (int64_t i = 0; i < n_blocks; ++i, bytes += sizeof(gb::BlockIq4Xs)) {
    gb::BlockIq4Xs b;
    std::memcpy(&b, bytes, sizeof b);
    const float d = fp16ToFloat(b.d);
    for (int ib = 0; ib < gb::kQKK / 32; ++ib, out += 32) {
      const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
      const int high = (b.scales_h >> (2 * ib)) & 3;
      const __m512 dl = _mm512_set1_ps(d * static_cast<float>((low | (high << 4)) - 32));
      lookupNibbles(table, b.qs + 16 * ib, dl, out, out + 16);
    }
  }
}

void dequantMxfp4(const unsigned char* bytes, int64_t n_blocks, float* out) {
  const __m512 table = codebook(gb::kMxfp4Values.data());
  for (int64_t i = 0; i < n_blocks; ++i, bytes += sizeof(gb::BlockMxfp4), out += gb::kQK) {
    const __m512 d = _mm512_set1_ps(gb::e8m0ToFloatHalf(bytes[0]));
    lookupNibbles(table, bytes + 1, d, out, out + 16);
  }
}

}  // namespace

void dequantBlocksAvx512(WeightType type, const Int4Spec& int4, const void* blocks,
                         int64_t n_blocks, float* out) {
  const auto* bytes = static_cast<const unsigned char*>(blocks);
  switch (type) {
    case WeightType::Q8_0: return dequantQ8_0(bytes, n_blocks, out);
    case WeightType::Q4_0: return dequantInt4(bytes, n_blocks, 32, true, 18, out);
    case WeightType::INT4:
      return dequantInt4(bytes, n_blocks, int4.group, int4.symmetric, blockLayout(type, int4).bytes,
                         out);
    case WeightType::Q4_K: return dequantK4<false, gb::BlockQ4K>(bytes, n_blocks, out);
    case WeightType::Q5_K: return dequantK4<true, gb::BlockQ5K>(bytes, n_blocks, out);
    case WeightType::Q6_K: return dequantQ6K(bytes, n_blocks, out);
    case WeightType::IQ4_XS: return dequantIq4Xs(bytes, n_blocks, out);
    case WeightType::MXFP4: return dequantMxfp4(bytes, n_blocks, out);
    default: return ref::dequantBlocks(type, int4, blocks, n_blocks, out);
  }
}

}  // namespace tandem::experts::kernels
