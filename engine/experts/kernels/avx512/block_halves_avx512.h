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

// out [count rounded up to 16] = the f16 at first + g · stride for g < count (0 after).
inline void blockHalvesToFloat(const unsigned char* first, int64_t stride, int64_t count,
                               float* out) {
  for (int64_t g = 0; g < count; g += 16) {
    alignas(32) uint16_t halves[16] = {};
    const int64_t n = std::min<int64_t>(16, count - g);
    for (int64_t k = 0; k < n; ++k) std::memcpy(&halves[k], first + (g + k) * stride, 2);
    _mm512_storeu_ps(out + g,
                     _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(halves))));
  }
}

}  // namespace tandem::experts::kernels
