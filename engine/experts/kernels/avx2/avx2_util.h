#pragma once
// Helpers shared by the AVX2 kernel files. Include only from files compiled with the AVX2 flags
// (-mavx2 -mfma -mf16c): everything here is inline and would otherwise leak AVX2 code into
// callers that run on any x86-64.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tandem::experts::kernels::avx2 {
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

}  // namespace
}  // namespace tandem::experts::kernels::avx2
