#pragma once
// What the AMX backends share (amx/gemm_amx.cpp: amx_bf16, amx_int8; amx/gemm_amx_blocks.cpp:
// amx_blocks): the tile configuration, bf16 activations, the vectorised epilogue. Included only by
// files compiled with AVX-512 flags; functions that touch tiles carry TANDEM_AMX themselves.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// ... and, once their shuffles are inlined into our transposes, -Wuninitialized.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#if defined(_WIN32) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12's tile load/store macros pass the stride as `long`, which is 32 bits on Windows (LLP64):
// the assembler then refuses `(%rax,%r10d,1)`. The same instructions with a 64-bit stride.
#undef _tile_loadd_internal
#define _tile_loadd_internal(dst, base, stride)                                 \
  __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm" #dst "|tileloadd\t%%tmm" #dst \
                   ", [%0+%1*1]}" ::"r"((const void*)(base)),                   \
                   "r"((long long)(stride)))
#undef _tile_stored_internal
#define _tile_stored_internal(src, base, stride)                                             \
  __asm__ volatile("{tilestored\t%%tmm" #src ", (%0,%1,1)|tilestored\t[%0+%1*1], %%tmm" #src \
                   "}" ::"r"((void*)(base)),                                                 \
                   "r"((long long)(stride))                                                  \
                   : "memory")
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "engine/core/float_convert.h"
#include "engine/experts/kernels/packed_gemm.h"

#define TANDEM_AMX __attribute__((target("amx-tile,amx-bf16,amx-int8")))

namespace tandem::experts::kernels::amx {

inline constexpr int64_t kTileRows = 16;
inline constexpr int64_t kTileBytes = 64;

// GCC's tileloadd is an asm without a memory clobber: after vector stores that fill a buffer the
// next tile loads read, this keeps the compiler from sinking those stores past the loads.
inline void tileInputsWritten() { __asm__ volatile("" ::: "memory"); }

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline TileConfig makeConfig() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = kTileBytes;
    cfg.rows[t] = kTileRows;
  }
  return cfg;
}

// Loads our tile configuration once per thread. Another library on the same thread (oneDNN)
// may load its own, so compare with the live one (sttilecfg: 64 bytes) before trusting it.
TANDEM_AMX inline void ensureTileConfig() {
  static const TileConfig ours = makeConfig();
  TileConfig live;
  _tile_storeconfig(&live);
  if (std::memcmp(&live, &ours, sizeof ours) != 0) _tile_loadconfig(&ours);
}

// a [m, k] f32 → bf16 [m_pad, k_pad] (zero padding), round to nearest even.
inline void activationsBf16(const float* a, int64_t lda, int64_t m, int64_t k, int64_t m_pad,
                            int64_t k_pad, uint16_t* out) {
  const __m512i round = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  for (int64_t i = 0; i < m_pad; ++i) {
    uint16_t* dst = out + i * k_pad;
    int64_t p = 0;
    if (i < m) {
      const float* row = a + i * lda;
      for (; p + 16 <= k; p += 16) {
        const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(row + p));
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
        const __m512i rounded =
            _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(round, lsb)), 16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + p), _mm512_cvtepi32_epi16(rounded));
      }
      for (; p < k; ++p) dst[p] = floatToBf16(row[p]);
    }
    std::fill(dst + p, dst + k_pad, uint16_t{0});
  }
}

// c block [rows ≤ 32, cols ≤ 32] from the 2 × 2 accumulator tiles stored in `acc` [32][32]
// (fp32, or int32 scaled by row_scale[i] · col_scale[j]), plus the low-rank addend (z and bt
// already offset to this block). Vectorised: with k = 768 a scalar epilogue costs as much as
// the tile products it follows.
template <bool kInt8>
inline void epilogue(const void* acc, int64_t rows, int64_t cols, float* c, int64_t ldc,
                     bool accumulate, const float* row_scale, const float* col_scale,
                     const LowRankAddend* addend, const float* z, const float* bt) {
  for (int half = 0; half < 2; ++half) {
    const int64_t left = cols - 16 * half;
    if (left <= 0) break;
    const __mmask16 mask =
        left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
    const __m512 cs =
        col_scale ? _mm512_maskz_loadu_ps(mask, col_scale + 16 * half) : _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < rows; ++i) {
      __m512 value;
      if constexpr (kInt8) {
        const auto* ints = static_cast<const int32_t*>(acc) + i * 32 + 16 * half;
        value = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(ints)),
                              _mm512_mul_ps(_mm512_set1_ps(row_scale[i]), cs));
      } else {
        value = _mm512_load_ps(static_cast<const float*>(acc) + i * 32 + 16 * half);
      }
      if (addend) {
        for (int64_t r = 0; r < addend->rank; ++r) {
          const __m512 bv = _mm512_maskz_loadu_ps(mask, bt + r * addend->ldb + 16 * half);
          value = _mm512_fmadd_ps(_mm512_set1_ps(z[i * addend->ldz + r]), bv, value);
        }
      }
      float* out = c + i * ldc + 16 * half;
      if (accumulate) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, out));
      _mm512_mask_storeu_ps(out, mask, value);
    }
  }
}

}  // namespace tandem::experts::kernels::amx
