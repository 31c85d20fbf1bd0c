// The AVX2 + FMA (+ F16C) expert kernels, table "avx2" (expert_kernels.h), for the x86-64 CPUs
// without AVX-512 (AMD Zen 1-3, Intel client cores before Ice Lake, Alder Lake and later).
// Compiled with those flags on this file only; the dispatcher hands the table out only when
// cpuFeatures().canUseAvx2(). Every kernel sits in an anonymous namespace and avx2Kernels() is
// the one exported name, so no AVX2 code leaks into other translation units at link time.
//
// Matmuls: the AVX-512 file's structure, eight lanes wide and with half the registers (16):
// weights are converted to fp32 eight at a time inside the load (bf16: shift left 16; f16:
// vcvtph2ps), so the checkpoint's memory is read zero-copy. Ragged edges use vmaskmovps for f32
// and a zeroed buffer for 16-bit weights (AVX2 has no masked 16-bit load), so no padding is
// required.
//
// Elementwise: SiLU ⊙ up and its backward (eight lanes, an exp of our own), y += alpha · x for the
// per-token sums, bf16 → f32 for the row gathers. exp: x = k ln2 + t with k = round(x / ln2),
// |t| ≤ ln2 / 2; e^t by its degree-6 Taylor polynomial (truncation below 1.2e-7 relative, an fp32
// ulp), times 2^k built in the exponent field (AVX2 has no vscalefps). Inputs are clamped to ±88,
// so |k| ≤ 127 and 2^k is a normal float except at k = −127, where it is 0 (the true e^x there is
// below 1e-38, invisible in 1 + e^x); the sigmoid of any finite value is finite.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "engine/core/float_convert.h"
#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/weight_type_dispatch.h"

namespace tandem::experts::kernels {

namespace avx2 {

namespace {

// Lanes [0, remaining) set: the mask of vmaskmovps, which never touches masked-out memory.
inline __m256i tailMask(int64_t remaining) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int32_t count = static_cast<int32_t>(std::clamp<int64_t>(remaining, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), lane);
}

// Eight f32 from p; lanes at or past `remaining` are 0 and their memory is not read.
inline __m256 loadFloats(const float* p, int64_t remaining) {
  return remaining >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tailMask(remaining));
}

inline void storeFloats(float* p, __m256 v, int64_t remaining) {
  if (remaining >= 8) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, tailMask(remaining), v);
  }
}

// Eight 16-bit values from p; lanes at or past `remaining` are 0 and not read. AVX2 has no
// masked 16-bit load, so a tail goes through a zeroed buffer.
inline __m128i load16Bit(const void* p, int64_t remaining) {
  if (remaining >= 8) return _mm_loadu_si128(static_cast<const __m128i*>(p));
  alignas(16) uint16_t buffer[8] = {};
  if (remaining > 0) std::memcpy(buffer, p, static_cast<size_t>(remaining) * 2);
  return _mm_load_si128(reinterpret_cast<const __m128i*>(buffer));
}

// bf16 is the top half of an f32: widen and shift, exact for every bit pattern.
inline __m256 widenBf16x8(__m128i bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

inline float reduceAdd(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Register block geometry (16 ymm registers). The loops over a block carry `#pragma GCC
// unroll`: at -O2 GCC leaves them rolled and the accumulators spill to memory.
// matmulNT: kM rows of a against kN rows of b, 12 accumulators. Each a vector serves 6 FMAs (a
// 4 × 2 tile gave 2, and the loads of a from L2 then bounded the forward at ~15 % more time).
struct DotTile {
  static constexpr int kM = 2;
  static constexpr int kN = 6;
  static constexpr int kNarrowN = 2;  // the columns left over past the last 6
};
// matmulNN/TN: kM rows of c × 32 columns (a whole 64-byte line of bf16 weights per k step: b's
// rows are far apart, 1.5-4 KB, so each row's line is fetched once), 12 accumulators + 3 a + 1 b.
// 6 rows × 16 columns took ~11 % longer in the backward.
struct BroadcastTile {
  static constexpr int kM = 3;
  static constexpr int kVecs = 4;
  static constexpr int kCols = kVecs * 8;
};
// From kMinRows rows of a on, matmulNN first copies each 32-column block of b, kDepth k rows at a
// time, into a contiguous fp32 panel that every row tile then reads: b's rows are 1.5-4 KB apart,
// so read in place each k step fetches a line from another row, and rows 4 KB apart share one L1
// set. The copy also widens the weights once per panel instead of once per row tile. On 2 Zen 3
// cores a 32-row block of the Qwen3 backward ran 1.1-1.5x faster packed; below ~12 rows the copy
// cost more than it saved.
struct PackedPanel {
  static constexpr int64_t kMinRows = 12;
  static constexpr int64_t kDepth = 128;  // 16 KB of fp32: the panel stays in L1 beside a's rows
};

// Eight weights starting at element `index`, converted to fp32; lanes at or past `remaining`
// are 0.
template <WeightType kType>
__m256 loadWeights(const void* base, int64_t index, int64_t remaining) {
  const auto* bytes = static_cast<const char*>(base);
  if constexpr (kType == WeightType::F32) {
    return loadFloats(reinterpret_cast<const float*>(bytes + index * 4), remaining);
  } else if constexpr (kType == WeightType::BF16) {
    return widenBf16x8(load16Bit(bytes + index * 2, remaining));
  } else {
    return _mm256_cvtph_ps(load16Bit(bytes + index * 2, remaining));
  }
}

[[gnu::always_inline]] inline void storeRow(float* c, __m256 sum, float alpha, bool accumulate,
                                            int64_t remaining) {
  __m256 value = _mm256_mul_ps(_mm256_set1_ps(alpha), sum);
  if (accumulate) value = _mm256_add_ps(value, loadFloats(c, remaining));
  storeFloats(c, value, remaining);
}

// One step of eight k positions for a kM × kN tile; `remaining` is a constant 8 in the main
// loop (the branches in the loads fold away) and the tail's length once.
template <WeightType kType, int kM, int kN>
inline void dotStep(const float* const (&a_row)[kM], const int64_t (&b_row)[kN], const void* b,
                    int64_t p, int64_t remaining, __m256 (&acc)[kM][kN]) {
  __m256 av[kM];
#pragma GCC unroll 4
  for (int ii = 0; ii < kM; ++ii) av[ii] = loadFloats(a_row[ii] + p, remaining);
#pragma GCC unroll 8
  for (int jj = 0; jj < kN; ++jj) {
    const __m256 bv = loadWeights<kType>(b, b_row[jj] + p, remaining);
#pragma GCC unroll 4
    for (int ii = 0; ii < kM; ++ii) acc[ii][jj] = _mm256_fmadd_ps(av[ii], bv, acc[ii][jj]);
  }
}

// c [m, n] (= | +=) alpha · a [m, k] · bᵀ, b [n, k]. Rows past the edge of a or b alias the last
// valid row (computed, never stored), which keeps the tile free of branches.
template <WeightType kType, int kM, int kN>
void matmulNtTiles(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const void* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const int64_t k_whole = k / 8 * 8;
  // b outer: its kN rows (one block of weights) stay in L1 while every row block of a passes.
  for (int64_t j0 = 0; j0 < n; j0 += kN) {
    int64_t b_row[kN];
    for (int jj = 0; jj < kN; ++jj) b_row[jj] = std::min(j0 + jj, n - 1) * ldb;
    for (int64_t i0 = 0; i0 < m; i0 += kM) {
      const float* a_row[kM];
      for (int ii = 0; ii < kM; ++ii) a_row[ii] = a + std::min(i0 + ii, m - 1) * lda;
      __m256 acc[kM][kN];
#pragma GCC unroll 4
      for (auto& row : acc)
#pragma GCC unroll 8
        for (auto& v : row) v = _mm256_setzero_ps();
      for (int64_t p = 0; p < k_whole; p += 8) dotStep<kType, kM, kN>(a_row, b_row, b, p, 8, acc);
      if (k_whole < k) dotStep<kType, kM, kN>(a_row, b_row, b, k_whole, k - k_whole, acc);
      for (int ii = 0; ii < kM && i0 + ii < m; ++ii) {
        for (int jj = 0; jj < kN && j0 + jj < n; ++jj) {
          float* out = c + (i0 + ii) * ldc + j0 + jj;
          const float sum = alpha * reduceAdd(acc[ii][jj]);
          *out = accumulate ? *out + sum : sum;
        }
      }
    }
  }
}

// Whole kN-column tiles, then the leftover columns in narrow ones: the LoRA products have n = r
// (8, 16, ...), where an aliased 6-column tile would waste up to half its arithmetic.
template <WeightType kType, int kM>
void matmulNtRows(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const void* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  constexpr int64_t kBytes = kType == WeightType::F32 ? 4 : 2;
  const int64_t wide = n / DotTile::kN * DotTile::kN;
  if (wide > 0) {
    matmulNtTiles<kType, kM, DotTile::kN>(m, wide, k, alpha, a, lda, b, ldb, c, ldc, accumulate);
  }
  if (n > wide) {
    matmulNtTiles<kType, kM, DotTile::kNarrowN>(m, n - wide, k, alpha, a, lda,
                                                static_cast<const char*>(b) + wide * ldb * kBytes,
                                                ldb, c + wide, ldc, accumulate);
  }
}

// Whole kM-row tiles, then the leftover row: a decode step sends one token to each expert, and
// an aliased 2-row tile would do twice its arithmetic for that one row.
template <WeightType kType>
void matmulNtImpl(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const void* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const int64_t tiled = m / DotTile::kM * DotTile::kM;
  if (tiled > 0)
    matmulNtRows<kType, DotTile::kM>(tiled, n, k, alpha, a, lda, b, ldb, c, ldc, accumulate);
  if (m > tiled) {
    matmulNtRows<kType, 1>(m - tiled, n, k, alpha, a + tiled * lda, lda, b, ldb, c + tiled * ldc,
                           ldc, accumulate);
  }
}

// acc [kM][kVecs] += A(i, p) · b [p, n0 + 8q ...] for one p (b_p: the offset of b [p, n0]).
// kWhole: all 32 columns exist, so the loads take the constant 8 and carry no tail branch. One k
// step per call, the loop over k in the caller beside its accumulators, as dotStep: with the loop
// in here GCC kept the sums in registers but also stored all 12 to the stack every step.
template <WeightType kType, int kM, bool kWhole>
inline void broadcastStep(const float* const (&a_row)[kM], int64_t a_p, const void* b, int64_t b_p,
                          const int64_t (&remaining)[BroadcastTile::kVecs],
                          __m256 (&acc)[kM][BroadcastTile::kVecs]) {
  __m256 av[kM];
#pragma GCC unroll 8
  for (int ii = 0; ii < kM; ++ii) av[ii] = _mm256_broadcast_ss(a_row[ii] + a_p);
#pragma GCC unroll 4
  for (int q = 0; q < BroadcastTile::kVecs; ++q) {
    const __m256 bv = loadWeights<kType>(b, b_p + 8 * q, kWhole ? 8 : remaining[q]);
#pragma GCC unroll 8
    for (int ii = 0; ii < kM; ++ii) acc[ii][q] = _mm256_fmadd_ps(av[ii], bv, acc[ii][q]);
  }
}

// The first `rows` rows of a broadcast tile into c (row stride ldc), `remaining` columns. The
// loops unroll whole, so every acc[ii][q] is a register: a loop with a bound known only at run
// time (ii < rows) indexes acc in memory, and GCC then stores the sums every k step.
template <int kM>
[[gnu::always_inline]] inline void storeTile(const __m256 (&acc)[kM][BroadcastTile::kVecs],
                                             int64_t rows,
                                             const int64_t (&remaining)[BroadcastTile::kVecs],
                                             float alpha, bool accumulate, float* c, int64_t ldc) {
#pragma GCC unroll 8
  for (int ii = 0; ii < kM; ++ii) {
#pragma GCC unroll 4
    for (int q = 0; q < BroadcastTile::kVecs; ++q) {
      if (ii < rows && remaining[q] > 0) {
        storeRow(c + ii * ldc + 8 * q, acc[ii][q], alpha, accumulate, remaining[q]);
      }
    }
  }
}

// c [m, n] (= | +=) alpha · Σ_p A(i, p) · b [p, n], with A(i, p) = a[i · a_rs + p · a_cs], so one
// kernel serves a · b (a_rs = lda, a_cs = 1) and aᵀ · b (a_rs = 1, a_cs = lda).
template <WeightType kType, int kM>
void matmulBroadcastRows(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_rs,
                         int64_t a_cs, const void* b, int64_t ldb, float* c, int64_t ldc,
                         bool accumulate) {
  constexpr int kVecs = BroadcastTile::kVecs;
  for (int64_t n0 = 0; n0 < n; n0 += BroadcastTile::kCols) {
    int64_t remaining[kVecs];
    for (int q = 0; q < kVecs; ++q) remaining[q] = n - n0 - 8 * q;
    for (int64_t i0 = 0; i0 < m; i0 += kM) {
      const float* a_row[kM];
      for (int ii = 0; ii < kM; ++ii) a_row[ii] = a + std::min(i0 + ii, m - 1) * a_rs;
      __m256 acc[kM][kVecs];
#pragma GCC unroll 8
      for (auto& row : acc)
#pragma GCC unroll 4
        for (auto& v : row) v = _mm256_setzero_ps();
      if (remaining[kVecs - 1] >= 8) {
        for (int64_t p = 0; p < k; ++p) {
          broadcastStep<kType, kM, true>(a_row, p * a_cs, b, p * ldb + n0, remaining, acc);
        }
      } else {
        for (int64_t p = 0; p < k; ++p) {
          broadcastStep<kType, kM, false>(a_row, p * a_cs, b, p * ldb + n0, remaining, acc);
        }
      }
      storeTile<kM>(acc, m - i0, remaining, alpha, accumulate, c + i0 * ldc + n0, ldc);
    }
  }
}

// b [p0, p0 + depth) × [n0, n0 + 32) as fp32 rows of 32, columns past n as 0.
template <WeightType kType>
void packPanel(const void* b, int64_t ldb, int64_t p0, int64_t depth, int64_t n0,
               const int64_t (&remaining)[BroadcastTile::kVecs], float* panel) {
  for (int64_t p = 0; p < depth; ++p) {
#pragma GCC unroll 4
    for (int q = 0; q < BroadcastTile::kVecs; ++q) {
      _mm256_store_ps(panel + p * BroadcastTile::kCols + 8 * q,
                      loadWeights<kType>(b, (p0 + p) * ldb + n0 + 8 * q, remaining[q]));
    }
  }
}

// One panel (k rows [p0, p0 + depth) of a 32-column block) against rows [i0, i0 + kM) of a:
// c (= | +=) alpha · the panel's part of the sum. Rows past m alias row m - 1 (never stored).
template <int kM>
void panelTile(int64_t m, int64_t i0, const float* a, int64_t a_rs, int64_t a_cs, int64_t p0,
               int64_t depth, const float* panel, const int64_t (&remaining)[BroadcastTile::kVecs],
               float alpha, float* c, int64_t ldc, bool accumulate) {
  constexpr int kVecs = BroadcastTile::kVecs;
  const float* a_row[kM];
  for (int ii = 0; ii < kM; ++ii) a_row[ii] = a + std::min(i0 + ii, m - 1) * a_rs + p0 * a_cs;
  __m256 acc[kM][kVecs];
#pragma GCC unroll 8
  for (auto& row : acc)
#pragma GCC unroll 4
    for (auto& v : row) v = _mm256_setzero_ps();
  for (int64_t p = 0; p < depth; ++p) {
    broadcastStep<WeightType::F32, kM, true>(a_row, p * a_cs, panel, p * BroadcastTile::kCols,
                                             remaining, acc);
  }
  storeTile<kM>(acc, m - i0, remaining, alpha, accumulate, c + i0 * ldc, ldc);
}

// matmulBroadcastImpl through packed panels (PackedPanel): the sum over k runs panel by panel,
// the first panel's partial sums stored as the call asks, the later ones added.
template <WeightType kType>
void matmulPackedImpl(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_rs,
                      int64_t a_cs, const void* b, int64_t ldb, float* c, int64_t ldc,
                      bool accumulate) {
  constexpr int kVecs = BroadcastTile::kVecs, kM = BroadcastTile::kM;
  alignas(32) thread_local float panel[PackedPanel::kDepth * BroadcastTile::kCols];
  const int64_t tiled = m / kM * kM;
  for (int64_t n0 = 0; n0 < n; n0 += BroadcastTile::kCols) {
    int64_t remaining[kVecs];
    for (int q = 0; q < kVecs; ++q) remaining[q] = n - n0 - 8 * q;
    for (int64_t p0 = 0; p0 < k; p0 += PackedPanel::kDepth) {
      const int64_t depth = std::min(PackedPanel::kDepth, k - p0);
      const bool add = accumulate || p0 > 0;
      packPanel<kType>(b, ldb, p0, depth, n0, remaining, panel);
      for (int64_t i0 = 0; i0 < tiled; i0 += kM) {
        panelTile<kM>(m, i0, a, a_rs, a_cs, p0, depth, panel, remaining, alpha, c + n0, ldc, add);
      }
      // The one or two rows left as one tile of their own height (see matmulBroadcastImpl).
      if (m - tiled == 2) {
        panelTile<2>(m, tiled, a, a_rs, a_cs, p0, depth, panel, remaining, alpha, c + n0, ldc, add);
      } else if (m - tiled == 1) {
        panelTile<1>(m, tiled, a, a_rs, a_cs, p0, depth, panel, remaining, alpha, c + n0, ldc, add);
      }
    }
  }
}

// Whole 3-row tiles, then the one or two rows left as one tile of their own height: each pass
// streams b's block again, so two 1-row passes would cost nearly two 3-row ones (a row block
// of 32 leaves 2).
template <WeightType kType>
void matmulBroadcastImpl(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_rs,
                         int64_t a_cs, const void* b, int64_t ldb, float* c, int64_t ldc,
                         bool accumulate) {
  const int64_t tiled = m / BroadcastTile::kM * BroadcastTile::kM;
  if (tiled > 0) {
    matmulBroadcastRows<kType, BroadcastTile::kM>(tiled, n, k, alpha, a, a_rs, a_cs, b, ldb, c, ldc,
                                                  accumulate);
  }
  const float* a_rest = a + tiled * a_rs;
  float* c_rest = c + tiled * ldc;
  if (m - tiled == 2) {
    matmulBroadcastRows<kType, 2>(2, n, k, alpha, a_rest, a_rs, a_cs, b, ldb, c_rest, ldc,
                                  accumulate);
  } else if (m - tiled == 1) {
    matmulBroadcastRows<kType, 1>(1, n, k, alpha, a_rest, a_rs, a_cs, b, ldb, c_rest, ldc,
                                  accumulate);
  }
}

void matmulNT(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const void* b, WeightType b_type, int64_t ldb, float* c, int64_t ldc,
              bool accumulate) {
  if (m <= 0 || n <= 0) return;
  withZeroCopyWeightType(b_type, [&]<WeightType kType>() {
    matmulNtImpl<kType>(m, n, k, alpha, a, lda, b, ldb, c, ldc, accumulate);
  });
}

void matmulNN(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const void* b, WeightType b_type, int64_t ldb, float* c, int64_t ldc,
              bool accumulate) {
  if (m <= 0 || n <= 0) return;
  withZeroCopyWeightType(b_type, [&]<WeightType kType>() {
    if (m >= PackedPanel::kMinRows) {
      matmulPackedImpl<kType>(m, n, k, alpha, a, lda, 1, b, ldb, c, ldc, accumulate);
    } else {
      matmulBroadcastImpl<kType>(m, n, k, alpha, a, lda, 1, b, ldb, c, ldc, accumulate);
    }
  });
}

void matmulTN(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (k <= 0 || n <= 0) return;
  // c [k, n] is the output: its rows run over a's columns, the sum over a's m rows.
  matmulBroadcastImpl<WeightType::F32>(k, n, m, alpha, a, 1, lda, b, ldb, c, ldc, true);
}

// Elementwise: SiLU ⊙ up, its backward, axpy, bf16 widening.

__m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.0f)), _mm256_set1_ps(88.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // t = x − k ln2, with ln2 split in two so k ln2 is exact to fp32.
  __m256 t = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  t = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), t);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f));
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)));
}

__m256 sigmoid8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}

void siluMul(int64_t n, const float* g, const float* u, float* h) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 gv = loadFloats(g + i, n - i);
    const __m256 uv = loadFloats(u + i, n - i);
    storeFloats(h + i, _mm256_mul_ps(_mm256_mul_ps(gv, sigmoid8(gv)), uv), n - i);
  }
}

float siluBackward(int64_t n, float w, const float* dh, float* g, float* u, float* h) {
  const __m256 one = _mm256_set1_ps(1.0f), wv = _mm256_set1_ps(w);
  __m256 dot = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t remaining = n - i;
    const __m256 gv = loadFloats(g + i, remaining);
    const __m256 uv = loadFloats(u + i, remaining);
    const __m256 dhv = loadFloats(dh + i, remaining);
    const __m256 sig = sigmoid8(gv);
    const __m256 silu = _mm256_mul_ps(gv, sig);
    const __m256 hv = _mm256_mul_ps(silu, uv);
    storeFloats(h + i, hv, remaining);
    dot = _mm256_fmadd_ps(dhv, hv, dot);  // masked-out lanes are 0 · 0
    const __m256 dh_w = _mm256_mul_ps(wv, dhv);
    // silu'(g) = σ(g) (1 + g (1 − σ(g)))
    const __m256 dsilu = _mm256_mul_ps(sig, _mm256_fmadd_ps(gv, _mm256_sub_ps(one, sig), one));
    storeFloats(g + i, _mm256_mul_ps(_mm256_mul_ps(dh_w, uv), dsilu), remaining);
    storeFloats(u + i, _mm256_mul_ps(dh_w, silu), remaining);
  }
  return reduceAdd(dot);
}

void axpy(int64_t n, float alpha, const float* x, float* y) {
  const __m256 av = _mm256_set1_ps(alpha);
  for (int64_t i = 0; i < n; i += 8) {
    storeFloats(y + i, _mm256_fmadd_ps(av, loadFloats(x + i, n - i), loadFloats(y + i, n - i)),
                n - i);
  }
}

void widenBf16(int64_t n, const uint16_t* bits, float* out) {
  const int64_t whole = n / 8 * 8;
  for (int64_t i = 0; i < whole; i += 8)
    _mm256_storeu_ps(out + i, widenBf16x8(load16Bit(bits + i, 8)));
  for (int64_t i = whole; i < n; ++i) out[i] = bf16ToFloat(bits[i]);
}

}  // namespace

}  // namespace avx2

const ExpertKernels& avx2Kernels() {
  static constexpr ExpertKernels kTable{.name = "avx2",
                                        .matmulNT = avx2::matmulNT,
                                        .matmulNN = avx2::matmulNN,
                                        .matmulTN = avx2::matmulTN,
                                        .siluMul = avx2::siluMul,
                                        .siluBackward = avx2::siluBackward,
                                        .axpy = avx2::axpy,
                                        .widenBf16 = avx2::widenBf16,
                                        .dequantBlocks = dequantBlocksAvx2};
  return kTable;
}

}  // namespace tandem::experts::kernels
