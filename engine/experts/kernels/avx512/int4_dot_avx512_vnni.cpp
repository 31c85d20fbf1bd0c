// The forward on Tandem int4 (and Q4_0) weights for a few rows: int8 dot products on the blocks
// as stored, the int4 counterpart of q4k_dot_avx512_vnni.cpp. Each row of a is quantised to int8
// once per call (one f32 scale per row, as amx_int8 quantises its activations; sums per group of
// W for the offsets), and each 128 elements of a row of W (4, 2 or 1 groups) become two registers
// of nibbles multiplied into every row by vpdpbusd (u8 nibbles × s8 activations, four products per
// int32 lane); the group scales d apply per lane in one f32 FMA. W is never widened, nothing goes
// through a scratch tile: at ~8 rows per expert (the 128-token case) the f32 / bf16 decode of W,
// not the multiply, was the cost.
//
// One group g (G elements, scale d_g, offset −8 d_g symmetric or m_g asymmetric) against one row
// of a (int8 q, scale dx):  Σ w·x = dx · (d_g · Σ nibble · q  +  offset_g · Σ q). Symmetric: the
// −8 enters each int32 dot through its starting value (−8 Σ q of that lane, computed once per
// call), so the dot is Σ (nibble − 8) · q and no offset term is left per row of W.

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined operands.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/core/error.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/avx512/block_halves_avx512.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

constexpr int64_t kChunk = 128;  // elements of a row per pair of nibble registers

struct Int4Layout {
  int64_t group = 32, block_bytes = 18, qs_offset = 2;
  bool symmetric = true;
};

Int4Layout int4Layout(const BlockWeights& w) {
  if (w.type == WeightType::Q4_0) return {};  // = int4 symmetric, group 32
  const bool symmetric = w.int4.symmetric;
  return {w.int4.group, blockLayout(w.type, w.int4).bytes, symmetric ? 2 : 4, symmetric};
}

// The activations of a call, quantised once: q [m][k_pad] int8 in chunk order (per 128
// elements: the first halves of its groups, then their second halves: the order the nibble
// registers hold W in), dx [m], sums [m][groups_pad] f32 (Σ q over each group of W; zero padded).
struct Int8Rows {
  const int8_t* q;
  const float* dx;
  const float* sums;
  const int32_t* neg8;  // symmetric formats: [m][chunks][16], −8 Σ q per lane; else nullptr
  int64_t k_pad, groups_pad;
};

Int8Rows quantiseRows(int64_t m, const float* a, int64_t lda, int64_t k, int64_t group,
                      bool symmetric) {
  const int64_t k_pad = (k + kChunk - 1) / kChunk * kChunk, chunks = k_pad / kChunk;
  const int64_t groups_pad = (k / group + 15) / 16 * 16;
  auto* q = static_cast<int8_t*>(threadArena(0, static_cast<size_t>(m * k_pad)));
  // scales [m], sums [m][groups_pad], then (symmetric) −8 Σ q per lane [m][chunks][16], 64-byte
  // aligned: groups_pad is a multiple of 16 and m is padded to 16.
  const int64_t m16 = (m + 15) / 16 * 16;
  auto* scales = static_cast<float*>(threadArena(
      1, static_cast<size_t>(m16 * (1 + groups_pad) + (symmetric ? m * chunks * 16 : 0)) * 4));
  float* sums = scales + m16;
  auto* neg8 = symmetric ? reinterpret_cast<int32_t*>(sums + m * groups_pad) : nullptr;
  const int64_t half = group / 2, per_chunk = kChunk / group;
  for (int64_t i = 0; i < m; ++i) {
    const float* x = a + i * lda;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p += 16)
      amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + p)));
    const float max_abs = _mm512_reduce_max_ps(amax);
    scales[i] = max_abs / 127.0f;
    const __m512 inv = _mm512_set1_ps(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
    int8_t* row = q + i * k_pad;
    std::memset(row, 0, static_cast<size_t>(k_pad));
    float* row_sums = sums + i * groups_pad;
    std::fill(row_sums, row_sums + groups_pad, 0.0f);
    for (int64_t g = 0; g < k / group; ++g) {
      const int64_t chunk = g / per_chunk, slot = g % per_chunk;
      __m512i sum = _mm512_setzero_si512();
      for (int64_t e = 0; e < group; e += 16) {
        // round to nearest even (MXCSR's default), |v| ≤ 127 by construction
        const __m512i v =
            _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + g * group + e), inv));
        sum = _mm512_add_epi32(sum, v);
        const int64_t at = chunk * kChunk + (e < half ? 0 : kChunk / 2) + slot * half + e % half;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(row + at), _mm512_cvtsepi32_epi8(v));
      }
      row_sums[g] = static_cast<float>(_mm512_reduce_add_epi32(sum));
    }
    if (!symmetric) continue;
    // Per chunk and int32 lane: −8 × the 8 activations that lane's two vpdpbusd multiply (4 of
    // the first halves, 4 of the second), so that a dot started from it is Σ (nibble − 8) · q.
    const __m512i eights = _mm512_set1_epi8(8);
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int8_t* qc = row + ch * kChunk;
      __m512i s8 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), eights, _mm512_loadu_si512(qc));
      s8 = _mm512_dpbusd_epi32(s8, eights, _mm512_loadu_si512(qc + kChunk / 2));
      _mm512_store_si512(neg8 + (i * chunks + ch) * 16,
                         _mm512_sub_epi32(_mm512_setzero_si512(), s8));
    }
  }
  return {q, scales, sums, neg8, k_pad, groups_pad};
}

// The nibbles of chunk c of one row of W: lo = first halves of its groups, hi = second halves
// (bytes of 0..15), and d_lanes = each int32 lane's group scale. Groups past the row: zeros.
struct Nibbles {
  __m512i lo, hi;
  __m512 d_lanes;
};

Nibbles loadChunk(const unsigned char* row, const Int4Layout& l, int64_t groups, int64_t c,
                  const float* d) {
  const int64_t g0 = c * (kChunk / l.group);
  const unsigned char* qs = row + g0 * l.block_bytes + l.qs_offset;
  __m512i v;
  __m512 d_lanes;
  if (l.group == 32) {
    v = _mm512_setzero_si512();
    const int64_t n = std::min<int64_t>(4, groups - g0);
    const auto load = [&](int b) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + b * l.block_bytes));
    };
    v = _mm512_inserti32x4(v, load(0), 0);
    if (n > 1) v = _mm512_inserti32x4(v, load(1), 1);
    if (n > 2) v = _mm512_inserti32x4(v, load(2), 2);
    if (n > 3) v = _mm512_inserti32x4(v, load(3), 3);
    const __m512i index = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    d_lanes = _mm512_permutexvar_ps(index, _mm512_maskz_loadu_ps(0xF, d + g0));
  } else if (l.group == 64) {
    const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
    v = _mm512_zextsi256_si512(first);
    if (groups - g0 > 1) {
      v = _mm512_inserti64x4(
          v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + l.block_bytes)), 1);
    }
    const __m512i index = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    d_lanes = _mm512_permutexvar_ps(index, _mm512_maskz_loadu_ps(0x3, d + g0));
  } else {
    v = _mm512_loadu_si512(qs);
    d_lanes = _mm512_set1_ps(d[g0]);
  }
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  return {_mm512_and_si512(v, low4), _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), d_lanes};
}

// out[i0 + i][j] (= | +=) for kRows rows of x and row j of W; d / offset [groups_pad] f32.
template <int kRows>
void dotRows(const unsigned char* row, const Int4Layout& l, int64_t k, const float* d,
             const float* offset, const Int8Rows& x, int64_t i0, float* c, int64_t ldc, int64_t j,
             bool accumulate) {
  const int64_t groups = k / l.group, chunks = (k + kChunk - 1) / kChunk;
  __m512 acc[kRows];
  for (int i = 0; i < kRows; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const Nibbles w = loadChunk(row, l, groups, ch, d);
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      const int8_t* q = x.q + (i0 + i) * x.k_pad + ch * kChunk;
      const __m512i start = x.neg8 ? _mm512_load_si512(x.neg8 + ((i0 + i) * chunks + ch) * 16)
                                   : _mm512_setzero_si512();
      __m512i dot = _mm512_dpbusd_epi32(start, w.lo, _mm512_loadu_si512(q));
      dot = _mm512_dpbusd_epi32(dot, w.hi, _mm512_loadu_si512(q + kChunk / 2));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), w.d_lanes, acc[i]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    if (!x.neg8) {  // asymmetric: the offsets m_g · Σ q over each group (symmetric: in the dots)
      const float* sums = x.sums + (i0 + i) * x.groups_pad;
      for (int64_t g = 0; g < x.groups_pad; g += 16)
        acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(offset + g), _mm512_loadu_ps(sums + g), acc[i]);
    }
    const float value = x.dx[i0 + i] * _mm512_reduce_add_ps(acc[i]);
    float& out = c[(i0 + i) * ldc + j];
    out = accumulate ? out + value : value;
  }
}

constexpr int kRowGroup = 8;  // rows whose accumulators stay in registers over one row of W

}  // namespace

void int4GemmNTVnni(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                    int64_t lda, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n1 <= n0) return;
  if (m > kFewRowMaxRows || (w.type != WeightType::INT4 && w.type != WeightType::Q4_0)) {
    throw Error("int4GemmNTVnni: " + std::to_string(m) + " rows of " +
                std::string(weightTypeName(w.type)) + ", at most " +
                std::to_string(kFewRowMaxRows) + " of int4 / q4_0 (a caller bug)");
  }
  const Int4Layout l = int4Layout(w);
  const int64_t k = w.cols, groups = k / l.group;
  const Int8Rows x = quantiseRows(m, a, lda, k, l.group, l.symmetric);
  // Per row of W: its group scales and offsets as f32 (slot 2; zero padded to 16 + 4 lanes so
  // the chunk loads and the offset dot never read past them).
  auto* d = static_cast<float*>(threadArena(2, static_cast<size_t>(2 * (x.groups_pad + 4)) * 4));
  float* offset = d + x.groups_pad + 4;
  std::fill(d, d + 2 * (x.groups_pad + 4), 0.0f);
  for (int64_t j = n0; j < n1; ++j) {
    const unsigned char* row = w.data + j * w.row_bytes;
    blockHalvesToFloat(row, l.block_bytes, groups, d);
    if (!l.symmetric) blockHalvesToFloat(row + 2, l.block_bytes, groups, offset);
    for (int64_t i0 = 0; i0 < m; i0 += kRowGroup) {
      // a constant count per call, so the accumulators are registers, not stack slots
      switch (std::min<int64_t>(kRowGroup, m - i0)) {
        case 1: dotRows<1>(row, l, k, d, offset, x, i0, c, ldc, j, accumulate); break;
        case 2: dotRows<2>(row, l, k, d, offset, x, i0, c, ldc, j, accumulate); break;
        case 3: dotRows<3>(row, l, k, d, offset, x, i0, c, ldc, j, accumulate); break;
        case 4: dotRows<4>(row, l, k, d, offset, x, i0, c, ldc, j, accumulate); break;
        case 5: dotRows<5>(row, l, k, d, offset, x, i0, c, ldc, j, accumulate); break;
        case 6: dotRows<6>(row, l, k, d, offset, x, i0, c, ldc, j, accumulate); break;
        case 7: dotRows<7>(row, l, k, d, offset, x, i0, c, ldc, j, accumulate); break;
        default: dotRows<8>(row, l, k, d, offset, x, i0, c, ldc, j, accumulate); break;
      }
    }
  }
}

}  // namespace tandem::experts::kernels
