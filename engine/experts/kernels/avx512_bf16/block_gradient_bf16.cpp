// The input gradient dX = dY · W on 4-bit blocks (Tandem int4, Q4_0, Q4_K) without widening W:
// the nibbles enter vdpbf16ps as the exact small integers they are, and every scale moves onto dY.
// For a group g of 32, 64 or 128 columns of row n of W (Q4_K: a sub-block of 32),
//   W[n, k] = s[n, g] · q[n, k] + o[n, g]   (int4 / Q4_0 symmetric: q − 8 with o = 0;
//                                            int4 asymmetric: s = d, o = m; Q4_K: s = d · sc_j,
//                                            o = −dmin · mn_j)
//   dX[t, k] = Σ_n (dY[t, n] · s[n, g]) · q[n, k]  +  Σ_n dY[t, n] · o[n, g].
// The first sum is a bf16 GEMM whose A operand, dY scaled per (row of W, group), is built once per
// call (one multiply per m · n · groups, 1/32 of the MACs or less) and whose B operand is a
// table lookup: bytes of nibbles of two rows of W interleaved into VNNI pairs, vpermw of a 16-entry
// bf16 table. The second is one f32 [m, groups] term added per group of columns. The old path
// (nibble → f32 lane → scale FMA → bf16 → pairs) cost 1.5-2× the multiply it fed at ~8 rows per
// expert; the lookup is ~5 instructions per 32 elements of W.
//
// Rounding: dY · s is rounded to bf16 once (the bf16 backends round dY and W each once), q is
// exact, the sums are f32, the offsets' sum f32 from unrounded operands.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/ggml_blocks.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/avx512/block_halves_avx512.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

namespace gb = ggml_blocks;

constexpr int64_t kChunk = 64;       // columns per micro-kernel chunk (4 vectors)
constexpr int64_t kSegPairs = 32;    // pairs of rows of W per segment
constexpr int kMaxRowsPerBlock = 6;  // rows of dY per register block: 6 × 4 accumulators
// Groups of one call's columns at most (ExpertLayer's widest input: 8192 columns of 32).
constexpr int64_t kMaxRowGroups = 256;

// How one format lays its nibbles and scales out.
struct NibbleFormat {
  WeightType type;
  int64_t group = 32;        // columns sharing one scale (Q4_K: a sub-block)
  int64_t block_elems = 32;  // columns per block
  int64_t block_bytes = 18;
  int64_t qs_offset = 2;
  bool symmetric = true;  // q − 8, no offset term
};

NibbleFormat nibbleFormat(WeightType type, const Int4Spec& int4) {
  if (type == WeightType::Q4_K) {
    return {type, 32, gb::kQKK, static_cast<int64_t>(sizeof(gb::BlockQ4K)), 4 + gb::kKScaleBytes,
            false};
  }
  if (type == WeightType::Q4_0) return {type, 32, 32, 18, 2, true};
  const BlockLayout l = blockLayout(type, int4);
  return {type, int4.group, l.elems, l.bytes, int4.symmetric ? 2 : 4, int4.symmetric};
}

float halfAt(const unsigned char* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// Scales s [g1 − g0] and offsets o [g1 − g0] of one row's groups [g0, g1), vectorised: Q4_K a
// super-block's 8 scales and 8 mins in one vector, int4 / Q4_0 16 blocks' halves at a time.
// s and o have room for a whole number of 16 past g1 − g0 (garbage there).
void rowScales(const NibbleFormat& f, const unsigned char* row, int64_t g0, int64_t g1, float* s,
               float* o) {
  if (f.type == WeightType::Q4_K) {
    for (int64_t sb = g0 / 8; sb * 8 < g1; ++sb) {
      const unsigned char* block = row + sb * f.block_bytes;
      alignas(16) uint8_t sc_mn[16];
      unpackScalesQ4K(block + 4, sc_mn);
      const __m512 factors =
          _mm512_insertf32x8(_mm512_set1_ps(halfAt(block)), _mm256_set1_ps(-halfAt(block + 2)), 1);
      alignas(64) float both[16];  // d · sc[0..7], −dmin · mn[0..7]
      _mm512_store_ps(
          both, _mm512_mul_ps(factors, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                           _mm_load_si128(reinterpret_cast<__m128i*>(sc_mn))))));
      const int64_t lo = std::max(g0, sb * 8), hi = std::min(g1, sb * 8 + 8);
      std::memcpy(s + (lo - g0), both + lo % 8, static_cast<size_t>(hi - lo) * 4);
      std::memcpy(o + (lo - g0), both + 8 + lo % 8, static_cast<size_t>(hi - lo) * 4);
    }
    return;
  }
  const unsigned char* block = row + g0 * f.block_bytes;
  blockHalvesToFloat(block, f.block_bytes, g1 - g0, s);
  if (!f.symmetric) blockHalvesToFloat(block + 2, f.block_bytes, g1 - g0, o);
}

// Where the nibbles of columns [c, c + 16) of any row lie (c a multiple of 16): 16 bytes at
// `byte` from the row's start, low nibbles (shift 0) or high (shift 4).
struct NibbleSpot {
  int64_t byte;
  int shift;
};

NibbleSpot nibbleSpot(const NibbleFormat& f, int64_t c) {
  const int64_t block = c / f.block_elems, e = c % f.block_elems;
  const int64_t base = block * f.block_bytes + f.qs_offset;
  if (f.type == WeightType::Q4_K) {  // per 64: low nibbles of 32 bytes, then their high nibbles
    return {base + 32 * (e / 64) + e % 32, e % 64 >= 32 ? 4 : 0};
  }
  const int64_t half = f.group / 2;  // per group: low nibbles of group / 2 bytes, then high
  return {base + e % half, e >= half ? 4 : 0};
}

// pairs [seg_pairs][64] of one 64-column chunk = (q[2p][col], q[2p + 1][col]) as bf16 integers
// (minus 8 for symmetric formats); zeros past W's rows and past `cols_valid` columns.
// The same bytes of the next segment's rows are prefetched meanwhile: W is read a segment of
// whole rows at a time, not down a column span (which stalled on every row's first load).
void decodeChunk(const NibbleFormat& f, const unsigned char* data, int64_t row_bytes, int64_t rows,
                 int64_t r0, int64_t seg_pairs, int64_t col0, int64_t cols_valid,
                 const __m512i& table, uint32_t* out) {
  int64_t byte[4] = {};
  __m128i shift[4];
  int vectors = 0;  // vectors of the chunk inside W; the rest are zeros
  for (int q = 0; q < 4 && 16 * q < cols_valid; ++q, ++vectors) {
    const NibbleSpot spot = nibbleSpot(f, col0 + 16 * q);
    byte[q] = spot.byte;
    shift[q] = _mm_cvtsi32_si128(spot.shift);
  }
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const int64_t next0 = r0 + 2 * seg_pairs, next1 = std::min(rows, next0 + 2 * kSegPairs);
  for (int64_t r = next0; r < next1; ++r) {
    const unsigned char* row = data + r * row_bytes;
    _mm_prefetch(reinterpret_cast<const char*>(row + byte[0]), _MM_HINT_T0);
    if (vectors > 0) {
      _mm_prefetch(reinterpret_cast<const char*>(row + byte[vectors - 1] + 15), _MM_HINT_T0);
    }
  }
  for (int64_t p = 0; p < seg_pairs; ++p) {
    const int64_t r = r0 + 2 * p;
    const unsigned char* even = data + r * row_bytes;
    const bool has_odd = r + 1 < rows;
    const unsigned char* odd = has_odd ? even + row_bytes : even;
    uint32_t* dst = out + p * kChunk;
    for (int q = 0; q < vectors; ++q) {
      const __m128i a = _mm_and_si128(
          _mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(even + byte[q])),
                        shift[q]),
          low4);
      const __m128i b = _mm_and_si128(
          _mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(odd + byte[q])), shift[q]),
          low4);
      const __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(a, b)),
                                                    _mm_unpackhi_epi8(a, b), 1);
      __m512i words = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(bytes), table);
      // an odd last row contributes nothing: its half of each pair is 0, not bf16(q − 8)
      if (!has_odd) words = _mm512_maskz_mov_epi16(0x55555555u, words);
      _mm512_store_si512(dst + 16 * q, words);
    }
    for (int q = vectors; q < 4; ++q) _mm512_store_si512(dst + 16 * q, _mm512_setzero_si512());
  }
}

// c [kM, ≤ 64] (+)= Σ_p a_s[i][p][group of the vector] · B[p] over one segment's pairs. Vectors 0-1
// of the chunk share group ga, 2-3 group gb (a chunk's halves each lie in one group: groups are
// ≥ 32 columns and chunks start on 32).
template <int kM>
void microKernel(const uint32_t* a_s, int64_t a_stride, int64_t g_stride, int ga, int gb_,
                 int64_t pairs, const uint32_t* bp, float* c, int64_t ldc, int64_t n_valid,
                 bool accumulate) {
  __m512 acc[kM][4];
#pragma GCC unroll 8
  for (int i = 0; i < kM; ++i)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) acc[i][q] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p, bp += kChunk) {
    __m512bh bv[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) bv[q] = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + 16 * q));
#pragma GCC unroll 8
    for (int i = 0; i < kM; ++i) {
      const uint32_t* ai = a_s + i * a_stride + p * g_stride;
      const auto lo = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(ai[ga])));
      const auto hi = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(ai[gb_])));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], lo, bv[0]);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], lo, bv[1]);
      acc[i][2] = _mm512_dpbf16_ps(acc[i][2], hi, bv[2]);
      acc[i][3] = _mm512_dpbf16_ps(acc[i][3], hi, bv[3]);
    }
  }
  for (int q = 0; q < 4; ++q) {
    const int64_t left = n_valid - 16 * q;
    if (left <= 0) break;
    const __mmask16 mask =
        left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
    for (int i = 0; i < kM; ++i) {
      float* out = c + i * ldc + 16 * q;
      __m512 value = acc[i][q];
      if (accumulate) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, out));
      _mm512_mask_storeu_ps(out, mask, value);
    }
  }
}

constexpr decltype(&microKernel<1>) kMicroKernels[kMaxRowsPerBlock] = {
    microKernel<1>, microKernel<2>, microKernel<3>, microKernel<4>, microKernel<5>, microKernel<6>};

}  // namespace

bool hasNibbleGemmNN(WeightType type) {
  if (type != WeightType::INT4 && type != WeightType::Q4_0 && type != WeightType::Q4_K) {
    return false;
  }
  return cpuFeatures().canUseAvx512Bf16();
}

void nibbleGemmNNBf16(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                      int64_t lda, float* c, int64_t ldc, bool accumulate,
                      const LowRankAddend* addend) {
  if (m <= 0 || n1 <= n0) return;
  if (w.type != WeightType::INT4 && w.type != WeightType::Q4_0 && w.type != WeightType::Q4_K) {
    throw Error("nibbleGemmNNBf16: " + std::string(weightTypeName(w.type)) +
                " is not a 4-bit type with nibbles (int4, q4_0, q4_k; a caller bug)");
  }
  if (n0 % 32 != 0) {
    throw Error("nibbleGemmNNBf16: first column " + std::to_string(n0) +
                " is not a multiple of 32 (a caller bug)");
  }
  const NibbleFormat f = nibbleFormat(w.type, w.int4);
  const int64_t N = w.rows;  // rows of W = columns of dY
  const int64_t n_pairs = (N + 1) / 2;
  // nibble → bf16 of (nibble − bias), bias 8 for the symmetric formats
  alignas(64) uint16_t table_bits[32] = {};
  for (int v = 0; v < 16; ++v) {
    const float value = static_cast<float>(v - (f.symmetric ? 8 : 0));
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    table_bits[v] = static_cast<uint16_t>(bits >> 16);  // small integers: exact in bf16
  }
  const __m512i table = _mm512_load_si512(table_bits);
  // Groups of the call's columns, a whole number of 8 (the scaled dY is built 8 groups at a
  // time: one vector of 8 pairs), and the chunks.
  const int64_t g0 = n0 / f.group, g1 = (n1 + f.group - 1) / f.group;
  const int64_t g_pad = (g1 - g0 + 7) / 8 * 8;
  if (g_pad > kMaxRowGroups) {
    throw Error("nibbleGemmNNBf16: " + std::to_string(n1 - n0) + " columns of groups of " +
                    std::to_string(f.group) + " exceed the kernel's " +
                    std::to_string(kMaxRowGroups) + " groups a call",
                "split the call's columns (gemmColumns) into narrower ranges");
  }
  const int64_t n_chunks = (n1 - n0 + kChunk - 1) / kChunk;
  // Rows per register block, as even as the blocks allow (8 rows: 4 + 4, not 6 + 2).
  const int64_t blocks = (m + kMaxRowsPerBlock - 1) / kMaxRowsPerBlock;
  const int64_t per_block = (m + blocks - 1) / blocks;
  // Scratch: one decoded chunk [kSegPairs][64] (slot 1); dY scaled [m][kSegPairs][g_pad] bf16
  // pairs, the offsets' sums [m][2 g_pad] and a segment's scales and offsets
  // [kSegPairs][2 g_pad] each (slot 2; lanes 2j, 2j + 1: group g0 + j of a pair's two rows).
  auto* chunk = static_cast<uint32_t*>(threadArena(1, static_cast<size_t>(kSegPairs * kChunk) * 4));
  const int64_t a_stride = kSegPairs * g_pad, lanes = 2 * g_pad;
  auto* a_s = static_cast<uint32_t*>(
      threadArena(2, static_cast<size_t>(m * a_stride + m * lanes + 2 * kSegPairs * lanes) * 4));
  auto* corr = reinterpret_cast<float*>(a_s + m * a_stride);
  float* seg_s = corr + m * lanes;
  float* seg_o = seg_s + kSegPairs * lanes;
  std::fill(corr, corr + m * lanes, 0.0f);
  // One row's scales and offsets: g_pad + 16 floats each (whole vectors past g1 − g0), zeros
  // past g1 − g0 so the padding groups of the scaled dY are zeros.
  float row_buf[4][kMaxRowGroups + 16] = {};
  float* row_s[2] = {row_buf[0], row_buf[1]};
  float* row_o[2] = {row_buf[2], row_buf[3]};

  for (int64_t p0 = 0; p0 < n_pairs; p0 += kSegPairs) {
    const int64_t seg = std::min(kSegPairs, n_pairs - p0);
    // Per pair: lanes 2j + e of seg_s / seg_o = group g0 + j of row 2 (p0 + p) + e.
    const __m512i interleave =
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    for (int64_t p = 0; p < seg; ++p) {
      for (int e = 0; e < 2; ++e) {
        const int64_t r = 2 * (p0 + p) + e;
        if (r < N) {
          rowScales(f, w.data + r * w.row_bytes, g0, g1, row_s[e], row_o[e]);
        } else {  // past W's last row: nothing (dY is 0 there too)
          std::fill(row_s[e], row_s[e] + g_pad + 16, 0.0f);
          std::fill(row_o[e], row_o[e] + g_pad + 16, 0.0f);
        }
      }
      for (int64_t j = 0; j < g_pad; j += 8) {
        const auto both = [&](float* const* rows) {
          return _mm512_permutex2var_ps(_mm512_castps256_ps512(_mm256_loadu_ps(rows[0] + j)),
                                        interleave,
                                        _mm512_castps256_ps512(_mm256_loadu_ps(rows[1] + j)));
        };
        _mm512_store_ps(seg_s + p * lanes + 2 * j, both(row_s));
        if (!f.symmetric) _mm512_store_ps(seg_o + p * lanes + 2 * j, both(row_o));
      }
    }
    // a_s[i][p][j] = (bf16(dY[i, 2p] s[2p, j]), bf16(dY[i, 2p + 1] s[2p + 1, j])).
    for (int64_t i = 0; i < m; ++i) {
      const float* ai = a + i * lda;
      float* corr_i = corr + i * lanes;
      for (int64_t p = 0; p < seg; ++p) {
        const int64_t n = 2 * (p0 + p);
        __m512 dy;  // lanes 2j, 2j + 1: dY[i, n], dY[i, n + 1] (0 past W's last row)
        if (n + 1 < N) {
          double both;
          std::memcpy(&both, ai + n, 8);
          dy = _mm512_castpd_ps(_mm512_set1_pd(both));
        } else {
          dy = _mm512_maskz_mov_ps(0x5555, _mm512_set1_ps(ai[n]));
        }
        uint32_t* dst = a_s + i * a_stride + p * g_pad;
        for (int64_t j = 0; j < g_pad; j += 8) {
          const __m512 scaled = _mm512_mul_ps(dy, _mm512_load_ps(seg_s + p * lanes + 2 * j));
          _mm256_store_si256(reinterpret_cast<__m256i*>(dst + j),
                             reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(scaled)));
          if (!f.symmetric) {
            _mm512_store_ps(corr_i + 2 * j,
                            _mm512_fmadd_ps(dy, _mm512_load_ps(seg_o + p * lanes + 2 * j),
                                            _mm512_load_ps(corr_i + 2 * j)));
          }
        }
      }
    }
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      const int64_t col0 = n0 + ch * kChunk;
      decodeChunk(f, w.data, w.row_bytes, N, 2 * p0, seg, col0, w.cols - col0, table, chunk);
      const int ga = static_cast<int>(col0 / f.group - g0);
      const int gb_ = static_cast<int>(std::min(col0 + 32, n1 - 1) / f.group - g0);
      for (int64_t i0 = 0; i0 < m; i0 += per_block) {
        const int64_t rows = std::min<int64_t>(per_block, m - i0);
        kMicroKernels[rows - 1](a_s + i0 * a_stride, a_stride, g_pad, ga, gb_, seg, chunk,
                                c + i0 * ldc + col0, ldc, n1 - col0, accumulate || p0 > 0);
      }
    }
  }
  // The offsets' term (one value per row and group) and the low-rank addend.
  if (f.symmetric && !addend) return;
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    for (int64_t col = n0; col < n1; col += 16) {
      const int64_t left = n1 - col;
      const __mmask16 mask =
          left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
      __m512 v = _mm512_maskz_loadu_ps(mask, ci + col);
      if (!f.symmetric) {  // 16 columns lie in one group (groups are ≥ 32, n0 is a multiple of 32)
        const int64_t j = col / f.group - g0;
        v = _mm512_add_ps(v, _mm512_set1_ps(corr[i * lanes + 2 * j] + corr[i * lanes + 2 * j + 1]));
      }
      if (addend) {
        for (int64_t q = 0; q < addend->rank; ++q) {
          v = _mm512_fmadd_ps(_mm512_set1_ps(addend->z[i * addend->ldz + q]),
                              _mm512_maskz_loadu_ps(mask, addend->bt + q * addend->ldb + col), v);
        }
      }
      _mm512_mask_storeu_ps(ci + col, mask, v);
    }
  }
}

}  // namespace tandem::experts::kernels
