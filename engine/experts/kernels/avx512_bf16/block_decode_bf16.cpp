// dequantBlocksBf16 (block_decode_bf16.h): block rows to bf16 for the bf16 block backends. The
// per-tile f32 decode (dequantBlocksAvx512 into an L1 buffer, then reloaded and rounded) was
// ~2.5× the cost of the bf16 micro-kernel it fed at a few rows per expert (issue 27); here the
// 4-bit types go nibbles → f32 lanes → vcvtne2ps2bf16 without leaving registers.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

#include "engine/core/ggml_blocks.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/block_decode_bf16.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels {

namespace {

namespace gb = ggml_blocks;

__m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

float halfToFloat(uint16_t bits) {
  return _mm512_cvtss_f32(_mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(bits))));
}

__m512 halfLanes(uint16_t bits) {
  return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(bits)));
}

uint16_t loadU16(const unsigned char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// 32 bf16 at out = lo (elements 0-15) and hi (16-31), rounded to nearest even.
void store32(uint16_t* out, __m512 lo, __m512 hi) {
  _mm512_storeu_si512(out, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
}

// Tandem int4 (group kGroup) and Q4_0 (symmetric, 32): element t of a group is the low nibble of
// qs[t] for t < kGroup/2, the high nibble of qs[t − kGroup/2] after. Same values as
// dequantBlocksAvx512: d · (q − 8) or fma(q, d, m).
template <int kGroup, bool kSymmetric>
void int4Blocks(const unsigned char* block, int64_t n_blocks, int64_t block_bytes, uint16_t* out) {
  constexpr int kVecs = kGroup / 16, kHalf = kVecs / 2;
  const __m512i nibble = _mm512_set1_epi32(0xF);
  for (int64_t i = 0; i < n_blocks; ++i, block += block_bytes, out += kGroup) {
    // d (and m) widened straight into all lanes: vpbroadcastw + vcvtph2ps, no scalar round trip.
    const __m512 d = halfLanes(loadU16(block));
    // Symmetric: fma(q, d, −8 d) rounds the exact q·d − 8d = d·(q − 8) once, as d · (q − 8) does
    // (q − 8 and 8 d are exact): the same bits in one instruction instead of two.
    const __m512 m =
        kSymmetric ? _mm512_mul_ps(d, _mm512_set1_ps(-8.0f)) : halfLanes(loadU16(block + 2));
    const uint8_t* qs = block + (kSymmetric ? 2 : 4);
    __m512 v[kVecs];
#pragma GCC unroll 4
    for (int c = 0; c < kHalf; ++c) {
      const __m512i bytes = _mm512_cvtepu8_epi32(load16(qs + 16 * c));
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, nibble));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
      v[c] = _mm512_fmadd_ps(lo, d, m);
      v[kHalf + c] = _mm512_fmadd_ps(hi, d, m);
    }
#pragma GCC unroll 4
    for (int t = 0; t < kVecs; t += 2) store32(out + 16 * t, v[t], v[t + 1]);
  }
}

template <int kGroup>
void int4BlocksOf(bool symmetric, const unsigned char* block, int64_t n_blocks, int64_t bytes,
                  uint16_t* out) {
  if (symmetric) {
    int4Blocks<kGroup, true>(block, n_blocks, bytes, out);
  } else {
    int4Blocks<kGroup, false>(block, n_blocks, bytes, out);
  }
}

// Q4_K: per 64 elements, 32 bytes of qs; low nibbles are sub-block 2k (scale d·sc, min dmin·mn),
// high nibbles sub-block 2k + 1. The 8 scales and 8 mins are unpacked and widened together:
// [d · sc0..7 | dmin · mn0..7] in one vector, the same products as pairScalesK4's.
void q4kBlocks(const unsigned char* bytes, int64_t n_blocks, uint16_t* out) {
  const __m512i nibble = _mm512_set1_epi32(0xF);
  for (int64_t i = 0; i < n_blocks; ++i, bytes += sizeof(gb::BlockQ4K), out += gb::kQKK) {
    const auto* b = reinterpret_cast<const gb::BlockQ4K*>(bytes);  // byte fields only, + memcpy
    alignas(16) uint8_t packed[16];
    unpackScalesQ4K(b->scales, packed);
    const __m512 factors = _mm512_insertf32x8(_mm512_set1_ps(halfToFloat(loadU16(bytes))),
                                              _mm256_set1_ps(halfToFloat(loadU16(bytes + 2))), 1);
    alignas(64) float scale_min[16];  // d · sc[0..7], dmin · mn[0..7]
    _mm512_store_ps(scale_min,
                    _mm512_mul_ps(factors, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(
                                               reinterpret_cast<__m128i*>(packed))))));
    const uint8_t* qs = bytes + 4 + gb::kKScaleBytes;
#pragma GCC unroll 4
    for (int k = 0; k < gb::kQKK / 64; ++k) {
      const __m512 d1 = _mm512_set1_ps(scale_min[2 * k]), m1 = _mm512_set1_ps(scale_min[8 + 2 * k]);
      const __m512 d2 = _mm512_set1_ps(scale_min[2 * k + 1]);
      const __m512 m2 = _mm512_set1_ps(scale_min[9 + 2 * k]);
      const __m512i b0 = _mm512_cvtepu8_epi32(load16(qs + 32 * k));
      const __m512i b1 = _mm512_cvtepu8_epi32(load16(qs + 32 * k + 16));
      const auto low = [&](__m512i v) { return _mm512_cvtepi32_ps(_mm512_and_si512(v, nibble)); };
      const auto high = [&](__m512i v) { return _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)); };
      store32(out + 64 * k, _mm512_fmsub_ps(low(b0), d1, m1), _mm512_fmsub_ps(low(b1), d1, m1));
      store32(out + 64 * k + 32, _mm512_fmsub_ps(high(b0), d2, m2),
              _mm512_fmsub_ps(high(b1), d2, m2));
    }
  }
}

// Any other type: one block at a time through the f32 decoder (every block is ≤ 256 elements
// and a multiple of 32).
void throughF32(WeightType type, const Int4Spec& int4, const unsigned char* bytes, int64_t n_blocks,
                uint16_t* out) {
  const BlockLayout layout = blockLayout(type, int4);
  alignas(64) float f32[256];
  for (int64_t i = 0; i < n_blocks; ++i, bytes += layout.bytes, out += layout.elems) {
    dequantBlocksAvx512(type, int4, bytes, 1, f32);
    for (int64_t e = 0; e < layout.elems; e += 32) {
      store32(out + e, _mm512_load_ps(f32 + e), _mm512_load_ps(f32 + e + 16));
    }
  }
}

}  // namespace

void dequantBlocksBf16(WeightType type, const Int4Spec& int4, const void* blocks, int64_t n_blocks,
                       uint16_t* out) {
  const auto* bytes = static_cast<const unsigned char*>(blocks);
  switch (type) {
    case WeightType::Q4_0: return int4Blocks<32, true>(bytes, n_blocks, 18, out);
    case WeightType::Q4_K: return q4kBlocks(bytes, n_blocks, out);
    case WeightType::INT4: {
      const int64_t block_bytes = blockLayout(type, int4).bytes;
      if (int4.group == 32)
        return int4BlocksOf<32>(int4.symmetric, bytes, n_blocks, block_bytes, out);
      if (int4.group == 64)
        return int4BlocksOf<64>(int4.symmetric, bytes, n_blocks, block_bytes, out);
      if (int4.group == 128) {
        return int4BlocksOf<128>(int4.symmetric, bytes, n_blocks, block_bytes, out);
      }
      return throughF32(type, int4, bytes, n_blocks, out);
    }
    default: return throughF32(type, int4, bytes, n_blocks, out);
  }
}

}  // namespace tandem::experts::kernels
