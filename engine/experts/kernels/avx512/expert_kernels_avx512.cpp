// The AVX-512 (F/BW/VL/DQ + FMA) expert kernels, table "avx512" (expert_kernels.h). Compiled with
// those flags on this file only; the dispatcher hands the table out only when
// cpuFeatures().canUseAvx512(). Every kernel sits in an anonymous namespace and avx512Kernels()
// is the one exported name, so no ISA-specific code leaks into other translation units at link
// time.
//
// Matmuls: weights are converted to fp32 sixteen at a time inside the load (bf16: shift left 16;
// f16: vcvtph2ps), so the checkpoint's memory is read zero-copy. Ragged edges use masked loads,
// which never touch masked-out memory, so no padding is required anywhere.
//
// Elementwise: SiLU ⊙ up and its backward (16 lanes, an exp of our own), y += alpha · x for the
// per-token sums, bf16 → f32 for the row gathers. exp: x = k ln2 + t with k = round(x / ln2),
// |t| ≤ ln2 / 2; e^t by its degree-6 Taylor polynomial (truncation below 1.2e-7 relative, an fp32
// ulp), times 2^k by vscalefps, which underflows to 0 and overflows to inf exactly where exp does.
// Inputs are clamped to ±88, so the sigmoid of any finite value is finite.

// GCC 12 flags its own _mm512_undefined_* helpers (self-initialised on purpose) as
// maybe-uninitialized once inlined (GCC PR 105593, fixed in 13); the warning is about the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>

#include "engine/experts/kernels/expert_kernels.h"
#include "engine/experts/kernels/weight_type_dispatch.h"

namespace tandem::experts::kernels {

namespace avx512 {

namespace {

// Register block geometry of the two micro-kernels. The loops over a block carry
// `#pragma GCC unroll`: at -O2 GCC leaves them rolled and the accumulators spill to memory.
struct DotTile {  // matmulNT: kM rows of a against kN rows of b, dot products along k
  static constexpr int kM = 4;
  static constexpr int kN = 4;
};
struct BroadcastTile {  // matmulNN/TN: kM rows of c, kVecs × 16 columns, rank-1 updates along k
  static constexpr int kM = 4;
  static constexpr int kVecs = 4;
  static constexpr int kCols = kVecs * 16;
};

// Lanes [0, remaining) set; remaining <= 0 gives none (the matmuls' ragged edges may ask).
__mmask16 tailMask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xffff)
                         : static_cast<__mmask16>((1u << std::max<int64_t>(remaining, 0)) - 1u);
}

// 16 weights starting at element `index`, converted to fp32; lanes outside `mask` are 0.
template <WeightType kType>
__m512 loadWeights(const void* base, int64_t index, __mmask16 mask) {
  const auto* bytes = static_cast<const char*>(base);
  if constexpr (kType == WeightType::F32) {
    return _mm512_maskz_loadu_ps(mask, bytes + index * 4);
  } else {
    const __m256i bits = _mm256_maskz_loadu_epi16(mask, bytes + index * 2);
    if constexpr (kType == WeightType::BF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    } else {
      return _mm512_cvtph_ps(bits);
    }
  }
}

void storeRow(float* c, __m512 sum, float alpha, bool accumulate, __mmask16 mask) {
  __m512 value = _mm512_mul_ps(_mm512_set1_ps(alpha), sum);
  if (accumulate) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, c));
  _mm512_mask_storeu_ps(c, mask, value);
}

// c [m, n] (= | +=) alpha · a [m, k] · bᵀ, b [n, k]. Rows past the edge of a or b alias the last
// valid row (computed, never stored), which keeps the kM × 4 tile free of branches.
template <WeightType kType, int kM>
void matmulNtRows(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const void* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  constexpr int kN = DotTile::kN;
  // b outer: its kN rows (one block of weights) stay in L1 while every row block of a passes.
  for (int64_t j0 = 0; j0 < n; j0 += kN) {
    int64_t b_row[kN];
    for (int jj = 0; jj < kN; ++jj) b_row[jj] = std::min(j0 + jj, n - 1) * ldb;
    for (int64_t i0 = 0; i0 < m; i0 += kM) {
      const float* a_row[kM];
      for (int ii = 0; ii < kM; ++ii) a_row[ii] = a + std::min(i0 + ii, m - 1) * lda;
      __m512 acc[kM][kN];
#pragma GCC unroll 4
      for (auto& row : acc)
#pragma GCC unroll 4
        for (auto& v : row) v = _mm512_setzero_ps();
      for (int64_t p = 0; p < k; p += 16) {
        const __mmask16 mask = tailMask(k - p);
        __m512 bv[kN];
#pragma GCC unroll 4
        for (int jj = 0; jj < kN; ++jj) bv[jj] = loadWeights<kType>(b, b_row[jj] + p, mask);
#pragma GCC unroll 4
        for (int ii = 0; ii < kM; ++ii) {
          const __m512 av = _mm512_maskz_loadu_ps(mask, a_row[ii] + p);
#pragma GCC unroll 4
          for (int jj = 0; jj < kN; ++jj) acc[ii][jj] = _mm512_fmadd_ps(av, bv[jj], acc[ii][jj]);
        }
      }
      // Constant bounds, so the loops unroll whole and acc stays in registers (as in the NN tile).
#pragma GCC unroll 4
      for (int ii = 0; ii < kM; ++ii) {
#pragma GCC unroll 4
        for (int jj = 0; jj < kN; ++jj) {
          if (i0 + ii >= m || j0 + jj >= n) continue;
          float* out = c + (i0 + ii) * ldc + j0 + jj;
          const float sum = alpha * _mm512_reduce_add_ps(acc[ii][jj]);
          *out = accumulate ? *out + sum : sum;
        }
      }
    }
  }
}

// Whole kM-row tiles, then the leftover rows one at a time: a decode step sends one token to
// each expert, and an aliased 4-row tile would do 4× its arithmetic for that one row.
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

// c [m, n] (= | +=) alpha · Σ_p A(i, p) · b [p, n], with A(i, p) = a[i · a_rs + p · a_cs], so one
// kernel serves a · b (a_rs = lda, a_cs = 1) and aᵀ · b (a_rs = 1, a_cs = lda).
template <WeightType kType>
void matmulBroadcastImpl(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_rs,
                         int64_t a_cs, const void* b, int64_t ldb, float* c, int64_t ldc,
                         bool accumulate) {
  constexpr int kM = BroadcastTile::kM, kVecs = BroadcastTile::kVecs;
  for (int64_t n0 = 0; n0 < n; n0 += BroadcastTile::kCols) {
    __mmask16 mask[kVecs];
    for (int q = 0; q < kVecs; ++q) mask[q] = tailMask(n - n0 - 16 * q);
    for (int64_t i0 = 0; i0 < m; i0 += kM) {
      const float* a_row[kM];
      for (int ii = 0; ii < kM; ++ii) a_row[ii] = a + std::min(i0 + ii, m - 1) * a_rs;
      __m512 acc[kM][kVecs];
#pragma GCC unroll 4
      for (auto& row : acc)
#pragma GCC unroll 4
        for (auto& v : row) v = _mm512_setzero_ps();
      for (int64_t p = 0; p < k; ++p) {
        __m512 bv[kVecs];
#pragma GCC unroll 4
        for (int q = 0; q < kVecs; ++q) {
          bv[q] = loadWeights<kType>(b, p * ldb + n0 + 16 * q, mask[q]);
        }
#pragma GCC unroll 4
        for (int ii = 0; ii < kM; ++ii) {
          const __m512 av = _mm512_set1_ps(a_row[ii][p * a_cs]);
#pragma GCC unroll 4
          for (int q = 0; q < kVecs; ++q) acc[ii][q] = _mm512_fmadd_ps(av, bv[q], acc[ii][q]);
        }
      }
      // Constant bounds, so the loops unroll whole and every acc[ii][q] is a register: with a
      // bound known only at run time acc is indexed in memory, and GCC then stores the sums to
      // the stack at every k step.
#pragma GCC unroll 4
      for (int ii = 0; ii < kM; ++ii) {
#pragma GCC unroll 4
        for (int q = 0; q < kVecs; ++q) {
          if (i0 + ii < m && mask[q] != 0) {
            storeRow(c + (i0 + ii) * ldc + n0 + 16 * q, acc[ii][q], alpha, accumulate, mask[q]);
          }
        }
      }
    }
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
    matmulBroadcastImpl<kType>(m, n, k, alpha, a, lda, 1, b, ldb, c, ldc, accumulate);
  });
}

void matmulTN(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (k <= 0 || n <= 0) return;
  // c [k, n] is the output: its rows run over a's columns, the sum over a's m rows.
  matmulBroadcastImpl<WeightType::F32>(k, n, m, alpha, a, 1, lda, b, ldb, c, ldc, true);
}

// Elementwise: SiLU ⊙ up, its backward, axpy, bf16 widening.

__m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0f)), _mm512_set1_ps(88.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // t = x − k ln2, with ln2 split in two so k ln2 is exact to fp32.
  __m512 t = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  t = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), t);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

__m512 sigmoid16(__m512 g) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

void siluMul(int64_t n, const float* g, const float* u, float* h) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = tailMask(n - i);
    const __m512 gv = _mm512_maskz_loadu_ps(mask, g + i);
    const __m512 uv = _mm512_maskz_loadu_ps(mask, u + i);
    _mm512_mask_storeu_ps(h + i, mask, _mm512_mul_ps(_mm512_mul_ps(gv, sigmoid16(gv)), uv));
  }
}

float siluBackward(int64_t n, float w, const float* dh, float* g, float* u, float* h) {
  const __m512 one = _mm512_set1_ps(1.0f), wv = _mm512_set1_ps(w);
  __m512 dot = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = tailMask(n - i);
    const __m512 gv = _mm512_maskz_loadu_ps(mask, g + i);
    const __m512 uv = _mm512_maskz_loadu_ps(mask, u + i);
    const __m512 dhv = _mm512_maskz_loadu_ps(mask, dh + i);
    const __m512 sig = sigmoid16(gv);
    const __m512 silu = _mm512_mul_ps(gv, sig);
    const __m512 hv = _mm512_mul_ps(silu, uv);
    _mm512_mask_storeu_ps(h + i, mask, hv);
    dot = _mm512_fmadd_ps(dhv, hv, dot);  // masked-out lanes are 0 · 0
    const __m512 dh_w = _mm512_mul_ps(wv, dhv);
    // silu'(g) = σ(g) (1 + g (1 − σ(g)))
    const __m512 dsilu = _mm512_mul_ps(sig, _mm512_fmadd_ps(gv, _mm512_sub_ps(one, sig), one));
    _mm512_mask_storeu_ps(g + i, mask, _mm512_mul_ps(_mm512_mul_ps(dh_w, uv), dsilu));
    _mm512_mask_storeu_ps(u + i, mask, _mm512_mul_ps(dh_w, silu));
  }
  return _mm512_reduce_add_ps(dot);
}

void axpy(int64_t n, float alpha, const float* x, float* y) {
  const __m512 av = _mm512_set1_ps(alpha);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = tailMask(n - i);
    const __m512 sum =
        _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mask, x + i), _mm512_maskz_loadu_ps(mask, y + i));
    _mm512_mask_storeu_ps(y + i, mask, sum);
  }
}

void widenBf16(int64_t n, const uint16_t* bits, float* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = tailMask(n - i);
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bits + i));
    _mm512_mask_storeu_ps(out + i, mask, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
  }
}

}  // namespace

}  // namespace avx512

const ExpertKernels& avx512Kernels() {
  static constexpr ExpertKernels kTable{.name = "avx512",
                                        .matmulNT = avx512::matmulNT,
                                        .matmulNN = avx512::matmulNN,
                                        .matmulTN = avx512::matmulTN,
                                        .siluMul = avx512::siluMul,
                                        .siluBackward = avx512::siluBackward,
                                        .axpy = avx512::axpy,
                                        .widenBf16 = avx512::widenBf16,
                                        .dequantBlocks = dequantBlocksAvx512};
  return kTable;
}

}  // namespace tandem::experts::kernels
