// The reference elementwise kernels of the expert layer: plain loops, the specification the
// vector versions are tested against.

#include <cmath>

#include "engine/core/float_convert.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels::ref {

namespace {
float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
}  // namespace

void siluMul(int64_t n, const float* g, const float* u, float* h) {
  for (int64_t i = 0; i < n; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

float siluBackward(int64_t n, float w, const float* dh, float* g, float* u, float* h) {
  float dot = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float sig = sigmoid(g[i]);
    h[i] = g[i] * sig * u[i];
    dot += dh[i] * h[i];
    const float dh_w = w * dh[i];
    // silu'(g) = σ(g) (1 + g (1 − σ(g)))
    const float dg = dh_w * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    u[i] = dh_w * g[i] * sig;  // du = w dh ⊙ silu(g)
    g[i] = dg;
  }
  return dot;
}

void axpy(int64_t n, float alpha, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void widenBf16(int64_t n, const uint16_t* bits, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16ToFloat(bits[i]);
}

}  // namespace tandem::experts::kernels::ref
