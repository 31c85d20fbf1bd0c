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
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQK + 32 * s + e),
                         _mm512_cvtsepi32_epi8(v));
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

void q4kGemmNTVnni(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                   int64_t lda, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n1 <= n0) return;
  if (m > kQ4kVnniMaxRows) {
    throw Error("q4kGemmNTVnni: " + std::to_string(m) + " rows, at most " +
                std::to_string(kQ4kVnniMaxRows) + " (a caller bug)");
  }
  const int64_t blocks = w.cols / kQK;
  const Q8Rows x = quantiseRows(m, a, lda, w.cols);
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  for (int64_t j = n0; j < n1; ++j) {
    const auto* row = reinterpret_cast<const gb::BlockQ4K*>(w.data + j * w.row_bytes);
    __m512 acc[kQ4kVnniMaxRows];   // d·dx·Σ sc·(nibble·q), 16 lanes per row
    __m128 accm[kQ4kVnniMaxRows];  // dmin·dx·Σ m·s, 4 lanes per row
    for (int64_t i = 0; i < m; ++i) {
      acc[i] = _mm512_setzero_ps();
      accm[i] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const gb::BlockQ4K& blk = row[b];
      alignas(16) uint8_t sc_min[16];  // 8 scales, then 8 mins
      unpackScalesQ4K(blk.scales, sc_min);
      const uint8_t* sc = sc_min;
      const uint8_t* mn = sc_min + kSubBlocks;
      // 64 elements per register: bytes 0-31 the low nibbles (sub-block 2k), 32-63 the high.
      __m512i nib[4], scale[4];
      for (int k4 = 0; k4 < 4; ++k4) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * k4));
        const __m256i lo = _mm256_and_si256(raw, low_mask);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low_mask);
        nib[k4] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        scale[k4] =
            _mm512_inserti64x4(_mm512_set1_epi32(sc[2 * k4]), _mm256_set1_epi32(sc[2 * k4 + 1]), 1);
      }
      int64_t mins64 = 0;
      std::memcpy(&mins64, mn, sizeof(mins64));
      const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins64));
      const float d = _cvtsh_ss(blk.d), dmin = _cvtsh_ss(blk.dmin);
      for (int64_t i = 0; i < m; ++i) {
        const int8_t* q = x.q + i * x.k + b * kQK;
        __m512i sum = _mm512_setzero_si512();
        for (int k4 = 0; k4 < 4; ++k4) {
          const __m512i dot =
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), nib[k4], _mm512_loadu_si512(q + 64 * k4));
          sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(dot, scale[k4]));
        }
        const float dx = x.dx[i * blocks + b];
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(d * dx), acc[i]);
        const __m128i s = _mm_loadu_si128(
            reinterpret_cast<const __m128i*>(x.sums + (i * blocks + b) * kSubBlocks));
        accm[i] =
            _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins, s)), _mm_set1_ps(dmin * dx), accm[i]);
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      const __m128 m2 = _mm_add_ps(accm[i], _mm_movehl_ps(accm[i], accm[i]));
      const float min_term = _mm_cvtss_f32(_mm_add_ss(m2, _mm_movehdup_ps(m2)));
      const float v = _mm512_reduce_add_ps(acc[i]) - min_term;
      float& out = c[i * ldc + j];
      out = accumulate ? out + v : v;
    }
  }
}

}  // namespace tandem::experts::kernels
