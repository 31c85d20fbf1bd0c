// The forward on Q6_K weights for a few rows, as llama.cpp's ggml_vec_dot_q6_K_q8_K: the rows of a
// are quantised to int8 per 256 elements (q8_K: one f32 scale, sums per 16), and each Q6_K block
// of W is unpacked into four registers of 6-bit quants (0..63, the stored q + 32) once and
// multiplied into every row by vpmaddubsw / vpmaddwd (AVX-512 BW). Q4_K_M files keep lm_head, half
// the experts' down projections and some attention values in Q6_K: before this, each of those
// rows was widened to f32 for every token (the largest block-decode cost of a decode step).
//
// One block (256 elements, sub-blocks s = 0..15 of 16, int8 scale sc_s, f16 d) against one row's
// block (int8 q, f32 scale dx, sums S_s of q over sub-block s):
//   Σ w·x = d · dx · (Σ_s sc_s · Σ_{i∈s} u_i · q_i  −  32 · Σ_s sc_s · S_s),   u = stored 6 bits
// exactly in int32 (|Σ_s sc_s Σ u q| ≤ 16 · 128 · 16 · 63 · 127 < 2^31).

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined operands.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "engine/core/error.h"
#include "engine/core/ggml_blocks.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

namespace gb = ggml_blocks;
constexpr int64_t kQK = gb::kQKK;         // elements per Q6_K / q8_K block
constexpr int64_t kSubBlocks = kQK / 16;  // int8 scales (and activation sums) per block
constexpr int64_t kBlockBytes = sizeof(gb::BlockQ6K);

// One row of a [k] f32 → q [k] int8 (element order), dx [k / 256], sums [k / 16] (int16: |Σ 16 q|
// ≤ 2032). dx = max|x| / 127 per block, q = round(x / dx) (0 for an all-zero block).
void quantiseRowQ8K16(const float* x, int64_t k, int8_t* q, float* dx, int16_t* sums) {
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float* xb = x + b * kQK;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t e = 0; e < kQK; e += 16)
      amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xb + e)));
    const float max_abs = _mm512_reduce_max_ps(amax);
    dx[b] = max_abs / 127.0f;
    const __m512 inv = _mm512_set1_ps(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
    for (int64_t s = 0; s < kSubBlocks; ++s) {
      // round to nearest even (MXCSR's default), |v| ≤ 127 by construction
      const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * s), inv));
      sums[b * kSubBlocks + s] = static_cast<int16_t>(_mm512_reduce_add_epi32(v));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQK + 16 * s), _mm512_cvtsepi32_epi8(v));
    }
  }
}

struct Q8Rows {
  const int8_t* q;
  const float* dx;
  const int16_t* sums;
  int64_t k;
};

// The activations of a call, quantised once (per-thread arenas 0 and 1: this path uses no other).
Q8Rows quantiseRows(int64_t m, const float* a, int64_t lda, int64_t k) {
  const int64_t blocks = k / kQK;
  auto* q = static_cast<int8_t*>(threadArena(0, static_cast<size_t>(m * k)));
  auto* scales = static_cast<float*>(threadArena(
      1, static_cast<size_t>(m * blocks) * (sizeof(float) + kSubBlocks * sizeof(int16_t))));
  auto* sums = reinterpret_cast<int16_t*>(scales + m * blocks);
  for (int64_t i = 0; i < m; ++i) {
    quantiseRowQ8K16(a + i * lda, k, q + i * k, scales + i * blocks,
                     sums + i * blocks * kSubBlocks);
  }
  return {q, scales, sums, k};
}

// out [kRows] (= | +=) rows i0 .. i0 + kRows of x · W[j, :] for one row j of W (`row`: its blocks,
// as stored). Per block the quants become four registers V_t of elements 64 t .. 64 t + 63 in
// order: V_2h from ql[64 h ..]'s low nibbles, V_2h+1 from their high nibbles, each with two bits
// of qh[32 h ..] (bits 0-1 / 2-3 for V_2h's two 32-byte halves, 4-5 / 6-7 for V_2h+1's).
template <int kRows>
void dotRows(const unsigned char* row, int64_t blocks, const Q8Rows& x, int64_t i0, float* c,
             int64_t ldc, int64_t j, bool accumulate) {
  __m512 acc[kRows];   // d · dx · Σ sc · (u · q), 16 lanes per row
  __m256 accm[kRows];  // 32 · d · dx · Σ sc · sums, 8 lanes per row
  for (int i = 0; i < kRows; ++i) {
    acc[i] = _mm512_setzero_ps();
    accm[i] = _mm256_setzero_ps();
  }
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  const __m512i low_shift = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
  const __m512i high_shift = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
  __m512i sc_index[4];  // int16 lane L of register t takes scale 4 t + L / 8
  for (int t = 0; t < 4; ++t) {
    alignas(64) int16_t index[32];
    for (int lane = 0; lane < 32; ++lane) index[lane] = static_cast<int16_t>(4 * t + lane / 8);
    sc_index[t] = _mm512_load_si512(index);
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const unsigned char* blk = row + b * kBlockBytes;
    const auto* ql = blk + offsetof(gb::BlockQ6K, ql);
    const auto* qh = blk + offsetof(gb::BlockQ6K, qh);
    __m512i v[4];
    for (int h = 0; h < 2; ++h) {
      const __m512i lows = _mm512_loadu_si512(ql + 64 * h);
      const __m512i highs =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h)));
      v[2 * h] = _mm512_or_si512(_mm512_and_si512(lows, low4),
                                 _mm512_and_si512(_mm512_sllv_epi64(highs, low_shift), bits45));
      v[2 * h + 1] =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(lows, 4), low4),
                          _mm512_and_si512(_mm512_srlv_epi64(highs, high_shift), bits45));
    }
    const __m128i sc8 =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(gb::BlockQ6K, scales)));
    const __m512i sc16 = _mm512_cvtepi8_epi16(_mm256_zextsi128_si256(sc8));  // lanes 0..15
    __m512i sc_lanes[4];  // int16 lane L of register t: sc_{4 t + L / 8}
    for (int t = 0; t < 4; ++t) sc_lanes[t] = _mm512_permutexvar_epi16(sc_index[t], sc16);
    const __m256i sc_sums = _mm256_cvtepi8_epi16(sc8);
    uint16_t d_bits = 0;
    std::memcpy(&d_bits, blk + offsetof(gb::BlockQ6K, d), 2);
    const float d = _cvtsh_ss(d_bits);
    for (int i = 0; i < kRows; ++i) {
      const int8_t* q = x.q + (i0 + i) * x.k + b * kQK;
      __m512i sum = _mm512_setzero_si512();
      for (int t = 0; t < 4; ++t) {
        const __m512i pairs = _mm512_maddubs_epi16(v[t], _mm512_loadu_si512(q + 64 * t));
        sum = _mm512_add_epi32(sum, _mm512_madd_epi16(pairs, sc_lanes[t]));
      }
      const float d_dx = d * x.dx[(i0 + i) * blocks + b];
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(d_dx), acc[i]);
      const __m256i s = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(x.sums + ((i0 + i) * blocks + b) * kSubBlocks));
      accm[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sc_sums, s)),
                                _mm256_set1_ps(32.0f * d_dx), accm[i]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    const __m128 m4 =
        _mm_add_ps(_mm256_castps256_ps128(accm[i]), _mm256_extractf128_ps(accm[i], 1));
    const __m128 m2 = _mm_add_ps(m4, _mm_movehl_ps(m4, m4));
    const float offset_term = _mm_cvtss_f32(_mm_add_ss(m2, _mm_movehdup_ps(m2)));
    const float value = _mm512_reduce_add_ps(acc[i]) - offset_term;
    float& out = c[(i0 + i) * ldc + j];
    out = accumulate ? out + value : value;
  }
}

constexpr int kRowGroup = 8;  // rows whose accumulators stay in registers over one row of W

}  // namespace

void q6kGemmNTAvx512(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                     int64_t lda, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n1 <= n0) return;
  if (m > kFewRowMaxRows) {
    throw Error("q6kGemmNTAvx512: " + std::to_string(m) + " rows, at most " +
                std::to_string(kFewRowMaxRows) + " (a caller bug)");
  }
  const int64_t blocks = w.cols / kQK;
  const Q8Rows x = quantiseRows(m, a, lda, w.cols);
  for (int64_t j = n0; j < n1; ++j) {
    const unsigned char* row = w.data + j * w.row_bytes;
    for (int64_t i0 = 0; i0 < m; i0 += kRowGroup) {
      // a constant count per call, so the accumulators are registers, not stack slots
      switch (std::min<int64_t>(kRowGroup, m - i0)) {
        case 1: dotRows<1>(row, blocks, x, i0, c, ldc, j, accumulate); break;
        case 2: dotRows<2>(row, blocks, x, i0, c, ldc, j, accumulate); break;
        case 3: dotRows<3>(row, blocks, x, i0, c, ldc, j, accumulate); break;
        case 4: dotRows<4>(row, blocks, x, i0, c, ldc, j, accumulate); break;
        case 5: dotRows<5>(row, blocks, x, i0, c, ldc, j, accumulate); break;
        case 6: dotRows<6>(row, blocks, x, i0, c, ldc, j, accumulate); break;
        case 7: dotRows<7>(row, blocks, x, i0, c, ldc, j, accumulate); break;
        default: dotRows<8>(row, blocks, x, i0, c, ldc, j, accumulate); break;
      }
    }
  }
}

}  // namespace tandem::experts::kernels
