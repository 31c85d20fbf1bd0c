// The reference expert kernels, table "generic" (expert_kernels.h): plain loops, the
// specification the vector tables are tested against. fp32 accumulation in the natural summation
// order; weights converted element by element. ref:: stays public so the kernel tests can hold
// every table to it.

#include <cmath>
#include <cstring>

#include "engine/core/float_convert.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels {

namespace ref {

namespace {
// Element `index` of a weight matrix. memcpy because views may be aligned to only 2 bytes.
// FP8 never reaches a kernel: it is dequantised to f32 when packed (plain_gemm.cpp).
float loadWeight(const void* base, WeightType type, int64_t index) {
  const auto* bytes = static_cast<const unsigned char*>(base);
  if (type == WeightType::F32) {
    float value;
    std::memcpy(&value, bytes + index * 4, sizeof value);
    return value;
  }
  uint16_t bits;
  std::memcpy(&bits, bytes + index * 2, sizeof bits);
  return type == WeightType::BF16 ? bf16ToFloat(bits) : fp16ToFloat(bits);
}

void store(float* c, float alpha, float sum, bool accumulate) {
  *c = accumulate ? *c + alpha * sum : alpha * sum;
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
}  // namespace

// c [m, n] (= | +=) alpha · a [m, k] · bᵀ, b [n, k] of b_type.
void matmulNT(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const void* b, WeightType b_type, int64_t ldb, float* c, int64_t ldc,
              bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t p = 0; p < k; ++p) sum += a[i * lda + p] * loadWeight(b, b_type, j * ldb + p);
      store(&c[i * ldc + j], alpha, sum, accumulate);
    }
  }
}

// c [m, n] (= | +=) alpha · a [m, k] · b, b [k, n] of b_type.
void matmulNN(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const void* b, WeightType b_type, int64_t ldb, float* c, int64_t ldc,
              bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t p = 0; p < k; ++p) sum += a[i * lda + p] * loadWeight(b, b_type, p * ldb + j);
      store(&c[i * ldc + j], alpha, sum, accumulate);
    }
  }
}

// c [k, n] += alpha · aᵀ · b, a [m, k] f32, b [m, n] f32.
void matmulTN(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t q = 0; q < k; ++q) {
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t i = 0; i < m; ++i) sum += a[i * lda + q] * b[i * ldb + j];
      c[q * ldc + j] += alpha * sum;
    }
  }
}

// Elementwise: SiLU ⊙ up, its backward, axpy, bf16 widening.

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

}  // namespace ref

const ExpertKernels& genericKernels() {
  static constexpr ExpertKernels kTable{.name = "generic",
                                        .matmulNT = ref::matmulNT,
                                        .matmulNN = ref::matmulNN,
                                        .matmulTN = ref::matmulTN,
                                        .siluMul = ref::siluMul,
                                        .siluBackward = ref::siluBackward,
                                        .axpy = ref::axpy,
                                        .widenBf16 = ref::widenBf16,
                                        .dequantBlocks = ref::dequantBlocks};
  return kTable;
}

}  // namespace tandem::experts::kernels
