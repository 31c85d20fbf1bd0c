#pragma once
// A 16 × 16 transpose of 32-bit lanes in zmm registers, for the files compiled with AVX-512 flags
// (avx512_bf16's pair layout, amx's activation tiles and transposed epilogue). Include only there.

// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined operands.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace tandem::experts::kernels {

// v[r] = 16 lanes of row r → v[j] = lane j of every row: unpack 32, unpack 64, then two 128-bit
// lane shuffles (64 shuffles per 256 lanes).
static inline void transpose16x16(__m512i v[16]) {
  __m512i t[16], r[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4g + c], lane L: rows 4g..4g+3 of element 4L + c
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
    const __m512i y0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i y1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
    v[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    v[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    v[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    v[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

}  // namespace tandem::experts::kernels
