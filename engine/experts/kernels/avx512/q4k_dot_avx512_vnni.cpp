// The forward on Q4_K weights for a few rows, as llama.cpp's ggml_vec_dot_q4_K_q8_K: the rows of
// a are quantised to int8 per 256 elements (q8_K: one f32 scale, sums per 32), and each Q4_K block
// of W is unpacked into four registers of nibbles once and multiplied into every row by vpdpbusd
// (AVX512-VNNI: u8 × s8, four products summed into each int32 lane). No block is ever widened to
// f32 and nothing goes through a scratch tile: at 8 rows per expert (the 128-token case) the
// f32 decode of the whole expert, not the multiply, was the cost (docs/benchmarks.md, issue 27).
//
// One block (256 elements, sub-blocks j = 0..7 of 32, 6-bit scale sc_j and min m_j, f16 d, dmin)
// against one row's block (int8 q, f32 scale dx, sums s_j of q over sub-block j):
//   Σ w·x = dx · (d · Σ_j sc_j · Σ_{i∈j} nibble_i · q_i  −  dmin · Σ_j m_j · s_j)
// exactly in int32 (|Σ_j sc_j Σ nibble q| ≤ 63·15·127·256 < 2^31), then two f32 FMAs per block.

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined operands.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/ggml_blocks.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

namespace gb = ggml_blocks;
constexpr int64_t kQK = gb::kQKK;         // elements per Q4_K / q8_K block
constexpr int64_t kSubBlocks = kQK / 32;  // 6-bit scales (and activation sums) per block

// One row of a [k] f32 → q [k] int8, dx [k / 256] and sums [k / 32] (int16: |Σ 32 q| ≤ 4064).
// dx = max|x| / 127 per block, q = round(x / dx) (0 for an all-zero block), as quantize_row_q8_K.
// Within a block q is stored in the weights' register order: q[64 t + 8 s + e] = element
// 32 s + 8 t + e (t = 0..3, sub-block s = 0..7, e = 0..7), so that int32 lanes 2 s and 2 s + 1 of
// every vpdpbusd hold sub-block s and four of them sum into one register before any scale.
void quantiseRowQ8K(const float* x, int64_t k, int8_t* q, float* dx, int16_t* sums) {
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float* xb = x + b * kQK;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t e = 0; e < kQK; e += 16)
      amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xb + e)));
    const float max_abs = _mm512_reduce_max_ps(amax);
    dx[b] = max_abs / 127.0f;
    const __m512 inv = _mm512_set1_ps(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
    for (int64_t s = 0; s < kSubBlocks; ++s) {
      __m512i sum = _mm512_setzero_si512();
      for (int64_t e = 0; e < 32; e += 16) {
        // round to nearest even (MXCSR's default), |v| ≤ 127 by construction
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * s + e), inv));
        sum = _mm512_add_epi32(sum, v);
        // elements 32 s + 8 t .. + 7 go to lane group t: q[64 t + 8 s ..] (dotRows)
        const __m128i bytes = _mm512_cvtsepi32_epi8(v);
        const int64_t t = e / 8;
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + b * kQK + 64 * t + 8 * s), bytes);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + b * kQK + 64 * (t + 1) + 8 * s),
                         _mm_unpackhi_epi64(bytes, bytes));
      }
      sums[b * kSubBlocks + s] = static_cast<int16_t>(_mm512_reduce_add_epi32(sum));
    }
  }
}

// The activations of a call, quantised once (per-thread arenas 0 and 1: this path uses no other).
struct Q8Rows {
  const int8_t* q;
  const float* dx;
  const int16_t* sums;
  int64_t k;
};

Q8Rows quantiseRows(int64_t m, const float* a, int64_t lda, int64_t k) {
  const int64_t blocks = k / kQK;
  auto* q = static_cast<int8_t*>(threadArena(0, static_cast<size_t>(m * k)));
  auto* scales = static_cast<float*>(threadArena(
      1, static_cast<size_t>(m * blocks) * (sizeof(float) + kSubBlocks * sizeof(int16_t))));
  auto* sums = reinterpret_cast<int16_t*>(scales + m * blocks);
  for (int64_t i = 0; i < m; ++i) {
    quantiseRowQ8K(a + i * lda, k, q + i * k, scales + i * blocks, sums + i * blocks * kSubBlocks);
  }
  return {q, scales, sums, k};
}

}  // namespace

bool q4kVnniAvailable(const CpuFeatures& features) {
  return features.canUseAvx512() && features.avx512_vnni;
}

namespace {

// out [kRows] (= | +=) rows i0 .. i0 + kRows of x · W[j, :] for one row j of W. Per block, the 128
// bytes of nibbles become four registers V_t whose qword s is qword 4 (s / 2) + t of the block's
// qs (chunk s / 2: low nibbles for even s, high for odd), the order the activations were stored
// in; the rows' int32 sums then need one scale per lane pair: d · sc_s.
template <int kRows>
void dotRows(const gb::BlockQ4K* row, int64_t blocks, const Q8Rows& x, int64_t i0, float* c,
             int64_t ldc, int64_t j, bool accumulate) {
  __m512 acc[kRows];   // d · dx · Σ sc · (nibble · q), 16 lanes per row
  __m128 accm[kRows];  // dmin · dx · Σ m · sums, 4 lanes per row
  for (int i = 0; i < kRows; ++i) {
    acc[i] = _mm512_setzero_ps();
    accm[i] = _mm_setzero_ps();
  }
  const __m512i shifts = _mm512_setr_epi64(0, 4, 0, 4, 0, 4, 0, 4);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b) {
    const gb::BlockQ4K& blk = row[b];
    const __m512i q0 = _mm512_loadu_si512(blk.qs), q1 = _mm512_loadu_si512(blk.qs + 64);
    __m512i v[4];
    for (int t = 0; t < 4; ++t) {
      const __m512i index = _mm512_setr_epi64(t, t, 4 + t, 4 + t, 8 + t, 8 + t, 12 + t, 12 + t);
      v[t] = _mm512_and_si512(_mm512_srlv_epi64(_mm512_permutex2var_epi64(q0, index, q1), shifts),
                              low4);
    }
    alignas(16) uint8_t sc_min[16];  // 8 scales, then 8 mins
    unpackScalesQ4K(blk.scales, sc_min);
    const __m128i sc_mn = _mm_load_si128(reinterpret_cast<const __m128i*>(sc_min));
    const float d = _cvtsh_ss(blk.d), dmin = _cvtsh_ss(blk.dmin);
    // lanes 2 s, 2 s + 1: d · sc_s
    const __m512 d_sc =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sc_mn, sc_mn))),
                      _mm512_set1_ps(d));
    const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sc_mn, sc_mn));
    for (int i = 0; i < kRows; ++i) {
      const int8_t* q = x.q + (i0 + i) * x.k + b * kQK;
      __m512i sum = _mm512_setzero_si512();
      for (int t = 0; t < 4; ++t)
        sum = _mm512_dpbusd_epi32(sum, v[t], _mm512_loadu_si512(q + 64 * t));
      const float dx = x.dx[(i0 + i) * blocks + b];
      acc[i] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d_sc, _mm512_set1_ps(dx)), acc[i]);
      const __m128i s = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(x.sums + ((i0 + i) * blocks + b) * kSubBlocks));
      accm[i] =
          _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins, s)), _mm_set1_ps(dmin * dx), accm[i]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    const __m128 m2 = _mm_add_ps(accm[i], _mm_movehl_ps(accm[i], accm[i]));
    const float min_term = _mm_cvtss_f32(_mm_add_ss(m2, _mm_movehdup_ps(m2)));
    const float value = _mm512_reduce_add_ps(acc[i]) - min_term;
    float& out = c[(i0 + i) * ldc + j];
    out = accumulate ? out + value : value;
  }
}

constexpr int kRowGroup = 8;  // rows whose accumulators stay in registers over one row of W

}  // namespace

void q4kGemmNTVnni(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                   int64_t lda, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n1 <= n0) return;
  if (m > kQ4kVnniMaxRows) {
    throw Error("q4kGemmNTVnni: " + std::to_string(m) + " rows, at most " +
                std::to_string(kQ4kVnniMaxRows) + " (a caller bug)");
  }
  const int64_t blocks = w.cols / kQK;
  const Q8Rows x = quantiseRows(m, a, lda, w.cols);
  for (int64_t j = n0; j < n1; ++j) {
    const auto* row = reinterpret_cast<const gb::BlockQ4K*>(w.data + j * w.row_bytes);
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
