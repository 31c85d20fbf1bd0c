// AVX-512 elementwise kernels of the expert layer: SiLU ⊙ up and its backward (16 lanes, an exp
// of our own), y += alpha · x for the per-token sums, bf16 → f32 for the row gathers. Compiled with the AVX-512 flags on this
// file only; everything but the entry points sits in an anonymous namespace.
//
// exp: x = k ln2 + t with k = round(x / ln2), |t| ≤ ln2 / 2; e^t by its degree-6 Taylor
// polynomial (truncation below 1.2e-7 relative, an fp32 ulp), times 2^k by vscalefps, which
// underflows to 0 and overflows to inf exactly where exp does. Inputs are clamped to ±88, so the
// sigmoid of any finite value is finite.

// GCC 12 flags its own _mm512_undefined_* helpers (self-initialised on purpose) once inlined
// (GCC PR 105593, fixed in 13); the warning is about the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels::avx512 {

namespace {

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

__mmask16 tailMask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xffff)
                         : static_cast<__mmask16>((1u << remaining) - 1u);
}

}  // namespace

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

}  // namespace tandem::experts::kernels::avx512
