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
#include "engine/experts/kernels/amx/amx_common.h"
#include "engine/experts/kernels/avx512/block_halves_avx512.h"
#include "engine/experts/kernels/avx512_transpose.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

namespace gb = ggml_blocks;

constexpr int64_t kChunk = 64;       // columns per micro-kernel chunk (4 vectors)
constexpr int64_t kSegPairs = 32;    // pairs of rows of W per segment
constexpr int kMaxRowsPerBlock = 6;  // rows of dY per register block: 6 × 4 accumulators

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

// Columns [s0, s1) of a segment's pairs of rows, s0 a multiple of 32, s1 − s0 ≤ kSpan, as
// out [chunk][kSegPairs][64] (chunk = (col − s0) / 64): (q[2p][col], q[2p + 1][col]) as bf16
// integers (minus 8 for the symmetric formats); zeros past W's rows and past s1 to the chunk's
// end. Each 16 bytes of nibbles feed two vectors (low and high nibbles): the bytes of the two rows
// are interleaved once, widened to words, and looked up twice (vpermw on the low 5 bits: the
// table repeats, so the low nibble needs no mask). Meanwhile the same bytes of the next segment's
// rows are prefetched: W is read a segment of whole rows at a time, not down a column span
// (which stalled on every row's first load).
struct NibbleJob {
  int64_t byte;  // in the row
  int lo, hi;    // destination vectors of the low / high nibbles (−1: outside [s0, s1))
};

int spanJobs(const NibbleFormat& f, int64_t s0, int64_t s1, NibbleJob* jobs) {
  int n = 0;
  for (int64_t col = s0; col < s1; col += 16) {
    const NibbleSpot spot = nibbleSpot(f, col);
    const int v = static_cast<int>((col - s0) / 16);
    int j = 0;
    while (j < n && jobs[j].byte != spot.byte) ++j;
    if (j == n) jobs[n++] = {spot.byte, -1, -1};
    (spot.shift ? jobs[j].hi : jobs[j].lo) = v;
  }
  return n;
}

constexpr int64_t kSpan = 256;

void decodeSpan(const NibbleFormat& f, const unsigned char* data, int64_t row_bytes, int64_t rows,
                int64_t r0, int64_t seg_pairs, int64_t s0, int64_t s1, const __m512i& table,
                uint32_t* out) {
  NibbleJob jobs[kSpan / 16] = {};
  const int n_jobs = spanJobs(f, s0, s1, jobs);
  const int used = static_cast<int>((s1 - s0 + 15) / 16);
  const int vectors = static_cast<int>((s1 - s0 + kChunk - 1) / kChunk * 4);
  int64_t first = jobs[0].byte, last = jobs[0].byte;
  for (int j = 1; j < n_jobs; ++j) {
    first = std::min(first, jobs[j].byte);
    last = std::max(last, jobs[j].byte);
  }
  const int64_t next0 = r0 + 2 * seg_pairs, next1 = std::min(rows, next0 + 2 * kSegPairs);
  for (int64_t r = next0; r < next1; ++r) {
    const unsigned char* row = data + r * row_bytes;
    for (int64_t b = first; b < last + 16; b += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(row + b), _MM_HINT_T1);
    }
    _mm_prefetch(reinterpret_cast<const char*>(row + last + 15), _MM_HINT_T1);
  }
  // Offsets in out of vector v at pair 0 (−1: not wanted).
  const auto offset = [](int v) -> int64_t {
    return v < 0 ? -1 : (v / 4) * kSegPairs * kChunk + 16 * (v % 4);
  };
  int64_t lo_at[kSpan / 16], hi_at[kSpan / 16];
  for (int j = 0; j < n_jobs; ++j) {
    lo_at[j] = offset(jobs[j].lo);
    hi_at[j] = offset(jobs[j].hi);
  }
  for (int64_t p = 0; p < seg_pairs; ++p) {
    const int64_t r = r0 + 2 * p;
    const unsigned char* even = data + r * row_bytes;
    const bool has_odd = r + 1 < rows;
    const unsigned char* odd = has_odd ? even + row_bytes : even;
    // an odd last row contributes nothing: its half of each pair is 0, not bf16(q − 8)
    const __mmask32 keep = has_odd ? 0xffffffffu : 0x55555555u;
    uint32_t* dst = out + p * kChunk;
    for (int j = 0; j < n_jobs; ++j) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(even + jobs[j].byte));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(odd + jobs[j].byte));
      const __m512i words = _mm512_cvtepu8_epi16(_mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_unpacklo_epi8(a, b)), _mm_unpackhi_epi8(a, b), 1));
      if (lo_at[j] >= 0) {
        _mm512_store_si512(dst + lo_at[j], _mm512_maskz_permutexvar_epi16(keep, words, table));
      }
      if (hi_at[j] >= 0) {
        _mm512_store_si512(dst + hi_at[j], _mm512_maskz_permutexvar_epi16(
                                               keep, _mm512_srli_epi16(words, 4), table));
      }
    }
    for (int v = used; v < vectors; ++v)
      _mm512_store_si512(dst + offset(v), _mm512_setzero_si512());
  }
  // Pairs up to the next 16 (the AMX path's last k tile): zeros, not stale or unset memory.
  for (int64_t p = seg_pairs; p < (seg_pairs + 15) / 16 * 16; ++p) {
    for (int v = 0; v < vectors; ++v) {
      _mm512_store_si512(out + p * kChunk + offset(v), _mm512_setzero_si512());
    }
  }
}

// c [kM, ≤ 64] (+)= Σ_p A[i][p] · B[p] over one segment's pairs, A the scaled dY of the group of
// the vector: vectors 0-1 of the chunk take a_lo (their group), 2-3 a_hi (a chunk's halves each
// lie in one group: groups are ≥ 32 columns and chunks start on 32). A rows are kSegPairs apart.
template <int kM>
void microKernel(const uint32_t* a_lo, const uint32_t* a_hi, int64_t pairs, const uint32_t* bp,
                 float* c, int64_t ldc, int64_t n_valid, bool accumulate) {
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
      const auto lo =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a_lo[i * kSegPairs + p])));
      const auto hi =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a_hi[i * kSegPairs + p])));
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

// The same on AMX-BF16 tiles, 16 rows of dY at a time: A tiles straight from a_lo / a_hi (16 rows
// × 16 pairs, kSegPairs · 4 bytes apart: zero rows past m), B tiles straight from the decoded
// chunk (16 pairs × 16 columns, 256 bytes apart). Few rows leave A half empty, but the nibble
// lookup, not the multiply, is the cost there, and it is shared with the vector kernel.
TANDEM_AMX void amxChunk(const uint32_t* a_lo, const uint32_t* a_hi, int64_t m, int64_t pairs,
                         const uint32_t* bp, float* c, int64_t ldc, int64_t n_valid,
                         bool accumulate) {
  alignas(64) float acc[16 * kChunk];
  const int64_t k_tiles = (pairs + 15) / 16;
  constexpr int64_t kAStride = kSegPairs * 4, kBStride = kChunk * 4;
  for (int64_t i0 = 0; i0 < m; i0 += 16) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kt = 0; kt < k_tiles; ++kt) {
      _tile_loadd(4, a_lo + i0 * kSegPairs + 16 * kt, kAStride);
      _tile_loadd(5, a_hi + i0 * kSegPairs + 16 * kt, kAStride);
      const uint32_t* b = bp + kt * 16 * kChunk;
      _tile_loadd(6, b, kBStride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, b + 16, kBStride);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(6, b + 32, kBStride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_loadd(7, b + 48, kBStride);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, acc, kBStride);
    _tile_stored(1, acc + 16, kBStride);
    _tile_stored(2, acc + 32, kBStride);
    _tile_stored(3, acc + 48, kBStride);
    for (int q = 0; q < 4; ++q) {
      const int64_t left = n_valid - 16 * q;
      if (left <= 0) break;
      const __mmask16 mask =
          left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
      for (int64_t i = i0; i < std::min(m, i0 + 16); ++i) {
        float* out = c + i * ldc + 16 * q;
        __m512 value = _mm512_load_ps(acc + (i - i0) * kChunk + 16 * q);
        if (accumulate) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, out));
        _mm512_mask_storeu_ps(out, mask, value);
      }
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

namespace {

void nibbleGemmNN(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                  int64_t lda, float* c, int64_t ldc, bool accumulate, const LowRankAddend* addend,
                  bool amx) {
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
  for (int v = 0; v < 32; ++v) {
    const float value = static_cast<float>(v % 16 - (f.symmetric ? 8 : 0));
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    table_bits[v] = static_cast<uint16_t>(bits >> 16);  // small integers: exact in bf16
  }
  const __m512i table = _mm512_load_si512(table_bits);
  // Groups of the call's columns, a whole number of 8 (the scaled dY is built 8 groups at a
  // time: one vector of 8 pairs), and the chunks.
  const int64_t g0 = n0 / f.group, g1 = (n1 + f.group - 1) / f.group;
  // Rows per register block, as even as the blocks allow (8 rows: 4 + 4, not 6 + 2).
  const int64_t blocks = (m + kMaxRowsPerBlock - 1) / kMaxRowsPerBlock;
  const int64_t per_block = (m + blocks - 1) / blocks;
  const int64_t n_groups = g1 - g0, g16 = (n_groups + 15) / 16 * 16;
  const int64_t m_rows = amx ? (m + 15) / 16 * 16 : m;  // AMX reads whole 16-row tiles
  constexpr int64_t kSegRows = 2 * kSegPairs;
  // Scratch. Slot 1: one decoded span [kSpan / 64][kSegPairs][64]. Slot 2: the scaled dY
  // [n_groups][m_rows][kSegPairs] bf16 pairs (zero rows past m), the offsets' sums [n_groups][m],
  // a segment's dY [m][kSegRows] (zeros past W's rows), its rows' scales and offsets
  // [kSegRows][g16] and the same transposed, [g16][kSegRows].
  auto* span = static_cast<uint32_t*>(
      threadArena(1, static_cast<size_t>(kSpan / kChunk * kSegPairs * kChunk) * 4));
  const int64_t a_group = m_rows * kSegPairs;
  const int64_t corr_len = (n_groups * m + 15) / 16 * 16;  // keeps what follows 64-byte aligned
  const size_t floats =
      static_cast<size_t>(n_groups * a_group + corr_len + m * kSegRows + 4 * kSegRows * g16);
  auto* a_s = static_cast<uint32_t*>(threadArena(2, floats * 4));
  auto* corr = reinterpret_cast<float*>(a_s + n_groups * a_group);
  float* dy_seg = corr + corr_len;
  float* row_s = dy_seg + m * kSegRows;  // [kSegRows][g16]
  float* row_o = row_s + kSegRows * g16;
  float* col_s = row_o + kSegRows * g16;  // [g16][kSegRows]
  float* col_o = col_s + g16 * kSegRows;
  std::fill(corr, corr + n_groups * m, 0.0f);
  std::fill(row_s, row_s + 2 * kSegRows * g16, 0.0f);  // Q4_K writes only its groups
  for (int64_t g = 0; g < n_groups && m_rows > m; ++g) {
    std::fill(a_s + g * a_group + m * kSegPairs, a_s + (g + 1) * a_group, 0u);
  }
  if (amx) amx::ensureTileConfig();

  for (int64_t p0 = 0; p0 < n_pairs; p0 += kSegPairs) {
    const int64_t seg = std::min(kSegPairs, n_pairs - p0);
    const int64_t r0 = 2 * p0, seg_rows = std::min(kSegRows, N - r0);
    for (int64_t r = 0; r < kSegRows; ++r) {
      if (r < seg_rows) {
        rowScales(f, w.data + (r0 + r) * w.row_bytes, g0, g1, row_s + r * g16, row_o + r * g16);
      } else {  // past W's last row: nothing (dY is 0 there too)
        std::fill(row_s + r * g16, row_s + (r + 1) * g16, 0.0f);
        std::fill(row_o + r * g16, row_o + (r + 1) * g16, 0.0f);
      }
    }
    // [kSegRows][g16] → [g16][kSegRows], 16 × 16 at a time.
    for (int t = 0; t < 2; ++t) {
      if (t == 1 && f.symmetric) break;
      const float* from = t ? row_o : row_s;
      float* to = t ? col_o : col_s;
      for (int64_t rb = 0; rb < kSegRows; rb += 16) {
        for (int64_t gb = 0; gb < g16; gb += 16) {
          __m512i v[16];
          for (int r = 0; r < 16; ++r) {
            v[r] = _mm512_castps_si512(_mm512_loadu_ps(from + (rb + r) * g16 + gb));
          }
          transpose16x16(v);
          for (int g = 0; g < 16; ++g) {
            _mm512_storeu_ps(to + (gb + g) * kSegRows + rb, _mm512_castsi512_ps(v[g]));
          }
        }
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t r = 0; r < kSegRows; r += 16) {
        const int64_t left = seg_rows - r;
        const __mmask16 mask = left >= 16  ? static_cast<__mmask16>(0xffff)
                               : left <= 0 ? static_cast<__mmask16>(0)
                                           : static_cast<__mmask16>((1u << left) - 1u);
        _mm512_store_ps(dy_seg + i * kSegRows + r,
                        _mm512_maskz_loadu_ps(mask, a + i * lda + r0 + r));
      }
    }
    // a_s[g][i][p] = (bf16(dY[i, 2p] s[2p, g]), bf16(dY[i, 2p + 1] s[2p + 1, g])): rows in order
    // are pairs in order. corr[g][i] += Σ_r dY[i, r] o[r, g].
    for (int64_t g = 0; g < n_groups; ++g) {
      const float* sg = col_s + g * kSegRows;
      const float* og = col_o + g * kSegRows;
      for (int64_t i = 0; i < m; ++i) {
        const float* dy = dy_seg + i * kSegRows;
        uint32_t* dst = a_s + g * a_group + i * kSegPairs;
        __m512 off = _mm512_setzero_ps();
        for (int64_t r = 0; r < kSegRows; r += 32) {
          const __m512 lo = _mm512_mul_ps(_mm512_load_ps(dy + r), _mm512_loadu_ps(sg + r));
          const __m512 hi =
              _mm512_mul_ps(_mm512_load_ps(dy + r + 16), _mm512_loadu_ps(sg + r + 16));
          _mm512_store_si512(dst + r / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
          if (!f.symmetric) {
            off = _mm512_fmadd_ps(_mm512_load_ps(dy + r), _mm512_loadu_ps(og + r), off);
            off = _mm512_fmadd_ps(_mm512_load_ps(dy + r + 16), _mm512_loadu_ps(og + r + 16), off);
          }
        }
        if (!f.symmetric) corr[g * m + i] += _mm512_reduce_add_ps(off);
      }
    }
    for (int64_t s0 = n0; s0 < n1;) {
      const int64_t s1 = std::min(n1, (s0 / kSpan + 1) * kSpan);
      decodeSpan(f, w.data, w.row_bytes, N, r0, seg, s0, s1, table, span);
      if (amx) amx::tileInputsWritten();
      for (int64_t col0 = s0; col0 < s1; col0 += kChunk) {
        const uint32_t* chunk = span + (col0 - s0) / kChunk * kSegPairs * kChunk;
        const uint32_t* a_lo = a_s + (col0 / f.group - g0) * a_group;
        const uint32_t* a_hi = a_s + (std::min(col0 + 32, n1 - 1) / f.group - g0) * a_group;
        const bool acc = accumulate || p0 > 0;
        if (amx) {
          amxChunk(a_lo, a_hi, m, seg, chunk, c + col0, ldc, n1 - col0, acc);
          continue;
        }
        for (int64_t i0 = 0; i0 < m; i0 += per_block) {
          const int64_t rows = std::min<int64_t>(per_block, m - i0);
          kMicroKernels[rows - 1](a_lo + i0 * kSegPairs, a_hi + i0 * kSegPairs, seg, chunk,
                                  c + i0 * ldc + col0, ldc, n1 - col0, acc);
        }
      }
      s0 = s1;
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
        v = _mm512_add_ps(v, _mm512_set1_ps(corr[j * m + i]));
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

}  // namespace

void nibbleGemmNNBf16(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                      int64_t lda, float* c, int64_t ldc, bool accumulate,
                      const LowRankAddend* addend) {
  nibbleGemmNN(w, n0, n1, m, a, lda, c, ldc, accumulate, addend, false);
}

void nibbleGemmNNAmx(const BlockWeights& w, int64_t n0, int64_t n1, int64_t m, const float* a,
                     int64_t lda, float* c, int64_t ldc, bool accumulate,
                     const LowRankAddend* addend) {
  nibbleGemmNN(w, n0, n1, m, a, lda, c, ldc, accumulate, addend, true);
}

}  // namespace tandem::experts::kernels
