// dequantBlocksAvx2: tiles of block weights to f32, 8 lanes at a time (AVX2 + FMA + F16C), for
// the x86-64 CPUs without AVX-512. The 4-bit and 8-bit linear types have vector versions; the
// codebook and 6-bit types go through ref::dequantBlocks (their tiles are reused over every row
// of a call, so the decode is not what bounds these machines).

#include <immintrin.h>

#include <cstring>

#include "engine/core/float_convert.h"
#include "engine/core/ggml_blocks.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels {

namespace {

namespace gb = ggml_blocks;

__m128i load8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
__m256 lowNibbles(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_cvtepu8_epi32(bytes), _mm256_set1_epi32(0xF)));
}
__m256 highNibbles(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_srli_epi32(_mm256_cvtepu8_epi32(bytes), 4));
}
uint16_t loadU16(const unsigned char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void dequantInt4(const unsigned char* block, int64_t n_blocks, int group, bool symmetric,
                 int64_t block_bytes, float* out) {
  const int half_group = group / 2;
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t i = 0; i < n_blocks; ++i, block += block_bytes, out += group) {
    const __m256 d = _mm256_set1_ps(fp16ToFloat(loadU16(block)));
    const __m256 m = _mm256_set1_ps(symmetric ? 0.0f : fp16ToFloat(loadU16(block + 2)));
    const uint8_t* qs = block + (symmetric ? 2 : 4);
    for (int c = 0; c < half_group; c += 8) {
      const __m128i bytes = load8(qs + c);
      const __m256 lo = lowNibbles(bytes), hi = highNibbles(bytes);
      if (symmetric) {
        _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_sub_ps(lo, eight), d));
        _mm256_storeu_ps(out + half_group + c, _mm256_mul_ps(_mm256_sub_ps(hi, eight), d));
      } else {
        _mm256_storeu_ps(out + c, _mm256_fmadd_ps(lo, d, m));
        _mm256_storeu_ps(out + half_group + c, _mm256_fmadd_ps(hi, d, m));
      }
    }
  }
}

void dequantQ8_0(const unsigned char* block, int64_t n_blocks, float* out) {
  for (int64_t i = 0; i < n_blocks; ++i, block += sizeof(gb::BlockQ8_0), out += gb::kQK) {
    const __m256 d = _mm256_set1_ps(fp16ToFloat(loadU16(block)));
    for (int c = 0; c < gb::kQK; c += 8) {
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(block + 2 + c)));
      _mm256_storeu_ps(out + c, _mm256_mul_ps(q, d));
    }
  }
}

void dequantQ4K(const unsigned char* bytes, int64_t n_blocks, float* out) {
  for (int64_t i = 0; i < n_blocks; ++i, bytes += sizeof(gb::BlockQ4K)) {
    gb::BlockQ4K b;
    std::memcpy(&b, bytes, sizeof b);
    for (int k = 0; k < gb::kQKK / 64; ++k, out += 64) {
      const gb::PairScales s = gb::pairScalesK4(b.d, b.dmin, b.scales, k);
      const __m256 d1 = _mm256_set1_ps(s.d1), m1 = _mm256_set1_ps(s.m1);
      const __m256 d2 = _mm256_set1_ps(s.d2), m2 = _mm256_set1_ps(s.m2);
      const uint8_t* q = b.qs + 32 * k;
      for (int c = 0; c < 32; c += 8) {
        const __m128i bytes8 = load8(q + c);
        _mm256_storeu_ps(out + c, _mm256_fmsub_ps(lowNibbles(bytes8), d1, m1));
        _mm256_storeu_ps(out + 32 + c, _mm256_fmsub_ps(highNibbles(bytes8), d2, m2));
      }
    }
  }
}

}  // namespace

void dequantBlocksAvx2(WeightType type, const Int4Spec& int4, const void* blocks, int64_t n_blocks,
                       float* out) {
  const auto* bytes = static_cast<const unsigned char*>(blocks);
  switch (type) {
    case WeightType::Q8_0: return dequantQ8_0(bytes, n_blocks, out);
    case WeightType::Q4_0: return dequantInt4(bytes, n_blocks, 32, true, 18, out);
    case WeightType::INT4:
      return dequantInt4(bytes, n_blocks, int4.group, int4.symmetric, blockLayout(type, int4).bytes,
                         out);
    case WeightType::Q4_K: return dequantQ4K(bytes, n_blocks, out);
    default: return ref::dequantBlocks(type, int4, blocks, n_blocks, out);
  }
}

}  // namespace tandem::experts::kernels
