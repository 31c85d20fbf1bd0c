#pragma once
// The f16 scales at the head of consecutive blocks of one row, as f32, for the AVX-512 block
// kernels (include only from files compiled with AVX-512 F + F16C). Scalar 16-bit copies and one
// vcvtph2ps per 16: a gather is slower on the CPUs measured (Zen 4; Sapphire Rapids since the
// Downfall microcode), and a scalar conversion per block cost ~10 % of the few-row int4 forward.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tandem::experts::kernels {

// The f16 at p, p + stride, p + 2 stride, p + 3 stride (the first `n` of them; 0 after) in one
// general register.
inline uint64_t fourHalves(const unsigned char* p, int64_t stride, int64_t n) {
  uint64_t packed = 0;
  for (int64_t k = 0; k < 4 && k < n; ++k) {
    uint16_t half;
    std::memcpy(&half, p + k * stride, 2);
    packed |= static_cast<uint64_t>(half) << (16 * k);
  }
  return packed;
}

// out [count rounded up to 16] = the f16 at first + g · stride for g < count (0 after). The
// halves are assembled in general registers, never stored and reloaded as a vector (16 two-byte
// stores read back by one 32-byte load miss store forwarding: ~11 % of the input gradient).
inline void blockHalvesToFloat(const unsigned char* first, int64_t stride, int64_t count,
                               float* out) {
  for (int64_t g = 0; g < count; g += 16) {
    const unsigned char* p = first + g * stride;
    const int64_t n = count - g;
    const __m128i lo =
        _mm_set_epi64x(static_cast<long long>(fourHalves(p + 4 * stride, stride, n - 4)),
                       static_cast<long long>(fourHalves(p, stride, n)));
    const __m128i hi =
        _mm_set_epi64x(static_cast<long long>(fourHalves(p + 12 * stride, stride, n - 12)),
                       static_cast<long long>(fourHalves(p + 8 * stride, stride, n - 8)));
    _mm512_storeu_ps(out + g,
                     _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1)));
  }
}

}  // namespace tandem::experts::kernels
