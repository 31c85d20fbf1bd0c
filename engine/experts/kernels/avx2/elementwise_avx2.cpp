// AVX2 + FMA elementwise kernels of the expert layer: SiLU ⊙ up and its backward (eight lanes,
// an exp of our own), y += alpha · x for the per-token sums, bf16 → f32 for the row gathers.
// Compiled with the AVX2 flags on this file only; everything but the entry points sits in an
// anonymous namespace.
//
// exp: x = k ln2 + t with k = round(x / ln2), |t| ≤ ln2 / 2; e^t by its degree-6 Taylor
// polynomial (truncation below 1.2e-7 relative, an fp32 ulp), times 2^k built in the exponent
// field (AVX2 has no vscalefps). Inputs are clamped to ±88, so |k| ≤ 127 and 2^k is a normal
// float except at k = −127, where it is 0 (the true e^x there is below 1e-38, invisible in
// 1 + e^x); the sigmoid of any finite value is finite.

#include "engine/core/float_convert.h"
#include "engine/experts/kernels/avx2/avx2_util.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels::avx2 {

namespace {

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

}  // namespace

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
  for (int64_t i = 0; i < whole; i += 8) _mm256_storeu_ps(out + i, widenBf16x8(load16Bit(bits + i, 8)));
  for (int64_t i = whole; i < n; ++i) out[i] = bf16ToFloat(bits[i]);
}

}  // namespace tandem::experts::kernels::avx2
