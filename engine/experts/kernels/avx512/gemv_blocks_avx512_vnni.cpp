// blockGemv (block_gemv.h): one activation row times Q4_K / Q6_K blocks, llama.cpp's q4_K / q6_K ×
// q8_K arithmetic. The activations are quantised once per call to int8 per 256 elements (f32 scale
// dx = max|x| / 127) with int16 sums per sub-block; each block of W against them is an exact int32
// sum, then one f32 FMA:
//   Q4_K (sub-blocks s of 32, 6-bit scale sc_s and min m_s, f16 d, dmin):
//     Σ w·x = dx · (d · Σ_s sc_s · Σ_{i∈s} nibble_i q_i  −  dmin · Σ_s m_s · S_s)
//   Q6_K (sub-blocks s of 16, int8 scale sc_s, f16 d; u = the stored 6 bits, w = d · sc · (u −
//   32)):
//     Σ w·x = d · dx · (Σ_s sc_s · Σ_{i∈s} u_i q_i  −  32 · Σ_s sc_s · S_s)
// vpdpbusd sums four u8 × s8 products per int32 lane (≤ 4 · 63 · 127 = 32004: an int16), and
// vpdpwssd multiplies that lane by its sub-block's scale (the lane's int16 pair (p, sign) against
// (sc, 0)) and accumulates: the scales never leave the integer domain. Four rows of W share the
// activation registers and one horizontal reduction (the few-row kernels reduce per row: at one
// row, with 2–4 blocks per row of W, that reduction was a large part of a row's cost).

// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm256_undefined operands.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstring>
#include <string>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/ggml_blocks.h"
#include "engine/experts/kernels/block_gemv.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

namespace {

namespace gb = ggml_blocks;
constexpr int64_t kQK = gb::kQKK;  // elements per block (Q4_K, Q6_K, q8_K)
constexpr int kRowsAtOnce = 4;     // rows of W whose accumulators are reduced together

// Q4_K's qs hold, per 64 elements, 32 bytes: low nibbles = elements 0..31, high = 32..63. Loaded
// 64 bytes at a time and masked, register t (0..3) of a block holds the nibbles of the sub-blocks
// kQ4Slot[2 t] (bytes 0..31) and kQ4Slot[2 t + 1] (bytes 32..63): the activations are stored in
// that order, so byte i of register t meets its activation at byte i of the same slot.
constexpr int kQ4Slot[8] = {0, 2, 1, 3, 4, 6, 5, 7};  // slot -> sub-block (and sub-block -> slot)

// x [k] f32 → per block b: dx[b], q[256 b ..] int8, sums[per_block * b ..] int16 of q over each
// sub-block of `sub` elements (in the element order); q in the element order (Q6_K) or in
// kQ4Slot order of 32-element chunks (Q4_K). q = round-to-nearest-even(x / dx), 0 for a zero block.
void quantiseRow(const float* x, int64_t k, bool q4_order, int sub, int8_t* q, float* dx,
                 int16_t* sums) {
  const int per_block = static_cast<int>(kQK) / sub;
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float* xb = x + b * kQK;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t e = 0; e < kQK; e += 16)
      amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xb + e)));
    const float max_abs = _mm512_reduce_max_ps(amax);
    dx[b] = max_abs / 127.0f;
    const __m512 inv = _mm512_set1_ps(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
    int8_t* qb = q + b * kQK;
    for (int s = 0; s < per_block; ++s) {
      __m512i total = _mm512_setzero_si512();
      for (int e = 0; e < sub; e += 16) {
        const int element = s * sub + e;
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + element), inv));
        total = _mm512_add_epi32(total, v);
        const int at = q4_order ? kQ4Slot[element / 32] * 32 + element % 32 : element;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + at), _mm512_cvtsepi32_epi8(v));
      }
      sums[b * per_block + s] = static_cast<int16_t>(_mm512_reduce_add_epi32(total));
    }
  }
}

// Byte-shuffle controls that spread a 16-byte table over the int32 lanes of a register as
// (value, 0) int16 pairs: 128-bit lane i of the result repeats entry entry_of_lane(i) of the table
// (a vpshufb on the table broadcast to all four 128-bit lanes), a uint8 entry (`bytes`) or an
// int16.
struct SpreadControl {
  alignas(64) int8_t bytes[64];
};
template <typename F>
constexpr SpreadControl spreadControl(F entry_of_lane, bool bytes) {
  SpreadControl control{};
  for (int lane = 0; lane < 4; ++lane) {
    const int entry = entry_of_lane(lane);
    for (int i = 0; i < 4; ++i) {
      int8_t* c = control.bytes + 16 * lane + 4 * i;
      c[0] = static_cast<int8_t>(bytes ? entry : 2 * entry);
      c[1] = static_cast<int8_t>(bytes ? -128 : 2 * entry + 1);  // -128: a zero byte
      c[2] = c[3] = -128;
    }
  }
  return control;
}
// Q4_K register t: int32 lanes 0..7 (128-bit lanes 0, 1) → scale of sub-block kQ4Slot[2 t],
// lanes 8..15 → kQ4Slot[2 t + 1] (bytes 0..7 of the table: the scales).
template <int t>
constexpr SpreadControl kQ4Spread =
    spreadControl([](int lane) { return kQ4Slot[2 * t + lane / 2]; }, true);
// Q6_K register t: 128-bit lane i → sub-block 4 t + i, an int16 of the half of the 16 int16 scales
// that holds it.
template <int t>
constexpr SpreadControl kQ6Spread = spreadControl([](int lane) { return (4 * t + lane) % 8; },
                                                  false);

inline __m512i load(const SpreadControl& control) { return _mm512_load_si512(control.bytes); }

// A Q4_K block's 12 scale bytes → 16 bytes: the 8 six-bit scales, then the 8 six-bit mins
// (unpackScalesQ4K in registers, without its trip through memory).
inline __m128i q4kScalesMins(const uint8_t* scales12) {
  // 16 bytes from the 12 scale bytes: the 4 after them (the block's first quants) are never
  // selected
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales12));
  const __m128i a =
      _mm_shuffle_epi8(raw, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i b = _mm_shuffle_epi8(
      raw, _mm_setr_epi8(-128, -128, -128, -128, 0, 1, 2, 3, -128, -128, -128, -128, 4, 5, 6, 7));
  const __m128i low =
      _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
  const __m128i high_nibble = _mm_and_si128(
      _mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
  const __m128i top_bits = _mm_and_si128(_mm_srli_epi16(b, 2), _mm_set1_epi8(0x30));
  return _mm_or_si128(_mm_or_si128(low, high_nibble), top_bits);
}

// A row's 16 f32 lanes → 8: lanes i and i + 8 added (the first step of every reduction below).
inline __m256 fold(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v),
                       _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE)));
}

// The kW rows' f32 accumulators → their sums, stored to y[0..kW). One row is summed in the order
// four are (pairs by hadd, then the two 128-bit halves): a row's value does not depend on whether
// a call's range put it in a group of four, so column splits (threads) give the same bits.
template <int kW>
__attribute__((always_inline)) inline void storeSums(const __m512* acc, float* y, bool accumulate) {
  if constexpr (kW == kRowsAtOnce) {
    const __m256 h01 = _mm256_hadd_ps(fold(acc[0]), fold(acc[1]));
    const __m256 h23 = _mm256_hadd_ps(fold(acc[2]), fold(acc[3]));
    const __m256 all = _mm256_hadd_ps(h01, h23);  // [r0 r1 r2 r3 | r0 r1 r2 r3] partial sums
    __m128 sums = _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
    if (accumulate) sums = _mm_add_ps(sums, _mm_loadu_ps(y));
    _mm_storeu_ps(y, sums);
  } else {
    for (int r = 0; r < kW; ++r) {
      const __m256 h = fold(acc[r]);
      const __m256 pairs = _mm256_hadd_ps(h, h);
      const __m256 quads = _mm256_hadd_ps(pairs, pairs);
      const float value =
          _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1)));
      y[r] = accumulate ? y[r] + value : value;
    }
  }
}

// y[0..kW) for rows first .. first + kW of W (`blocks` Q4_K blocks each, `row_bytes` apart),
// each row read in order.
template <int kW>
void q4kRows(const unsigned char* first, int64_t row_bytes, int64_t blocks, const int8_t* q,
             const float* dx, const int16_t* sums, float* y, bool accumulate) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i spread[4] = {load(kQ4Spread<0>), load(kQ4Spread<1>), load(kQ4Spread<2>),
                             load(kQ4Spread<3>)};
  __m512 acc[kW];
  for (int r = 0; r < kW; ++r) {
    const auto* row = reinterpret_cast<const gb::BlockQ4K*>(first + r * row_bytes);
    __m512 a = _mm512_setzero_ps();
    __m128 a_min = _mm_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const gb::BlockQ4K& blk = row[b];
      const int8_t* xb = q + b * kQK;
      const __m512i lo = _mm512_loadu_si512(blk.qs), hi = _mm512_loadu_si512(blk.qs + 64);
      const __m128i sc_mn = q4kScalesMins(blk.scales);
      const __m512i table = _mm512_broadcast_i32x4(sc_mn);
      const __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(lo, low4),
                                             _mm512_loadu_si512(xb));
      const __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                             _mm512_and_si512(_mm512_srli_epi16(lo, 4), low4),
                                             _mm512_loadu_si512(xb + 64));
      const __m512i p2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(hi, low4),
                                             _mm512_loadu_si512(xb + 128));
      const __m512i p3 = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                             _mm512_and_si512(_mm512_srli_epi16(hi, 4), low4),
                                             _mm512_loadu_si512(xb + 192));
      const __m512i t01 =
          _mm512_dpwssd_epi32(_mm512_madd_epi16(p0, _mm512_shuffle_epi8(table, spread[0])), p1,
                              _mm512_shuffle_epi8(table, spread[1]));
      const __m512i t23 =
          _mm512_dpwssd_epi32(_mm512_madd_epi16(p2, _mm512_shuffle_epi8(table, spread[2])), p3,
                              _mm512_shuffle_epi8(table, spread[3]));
      const __m128 d_dmin = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(
          static_cast<uint32_t>(blk.d) | (static_cast<uint32_t>(blk.dmin) << 16))));
      const __m128 dx_d_dmin = _mm_mul_ps(d_dmin, _mm_set1_ps(dx[b]));
      a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(t01, t23)),
                          _mm512_broadcastss_ps(dx_d_dmin), a);
      const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sc_mn, 8));
      const __m128i x_sums = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sums + 8 * b));
      a_min = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins, x_sums)),
                           _mm_shuffle_ps(dx_d_dmin, dx_d_dmin, 0x55), a_min);
    }
    acc[r] = _mm512_sub_ps(a, _mm512_zextps128_ps512(a_min));
  }
  storeSums<kW>(acc, y, accumulate);
}

// y[0..kW) for kW rows of W in Q6_K. Register t of a block holds elements 64 t .. 64 t + 63 in
// order (q6k_dot_avx512.cpp's unpacking): V_2h from ql[64 h ..]'s low nibbles, V_2h+1 from their
// high nibbles, each with two bits of qh[32 h ..].
template <int kW>
void q6kRows(const unsigned char* first, int64_t row_bytes, int64_t blocks, const int8_t* q,
             const float* dx, const int16_t* sums, float* y, bool accumulate) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  const __m512i low_shift = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
  const __m512i high_shift = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
  const __m512i spread[4] = {load(kQ6Spread<0>), load(kQ6Spread<1>), load(kQ6Spread<2>),
                             load(kQ6Spread<3>)};
  __m512 acc[kW];
  for (int r = 0; r < kW; ++r) {
    const auto* row = reinterpret_cast<const gb::BlockQ6K*>(first + r * row_bytes);
    __m512 a = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const gb::BlockQ6K& blk = row[b];
      const int8_t* xb = q + b * kQK;
      __m512i v[4];
      for (int h = 0; h < 2; ++h) {
        const __m512i lows = _mm512_loadu_si512(blk.ql + 64 * h);
        const __m512i highs = _mm512_broadcast_i64x4(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * h)));
        v[2 * h] = _mm512_or_si512(_mm512_and_si512(lows, low4),
                                   _mm512_and_si512(_mm512_sllv_epi64(highs, low_shift), bits45));
        v[2 * h + 1] =
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(lows, 4), low4),
                            _mm512_and_si512(_mm512_srlv_epi64(highs, high_shift), bits45));
      }
      const __m256i sc16 =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales)));
      const __m512i table_lo = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16));
      const __m512i table_hi = _mm512_broadcast_i32x4(_mm256_extracti128_si256(sc16, 1));
      __m512i p[4];
      for (int t = 0; t < 4; ++t)
        p[t] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[t], _mm512_loadu_si512(xb + 64 * t));
      const __m512i t01 =
          _mm512_dpwssd_epi32(_mm512_madd_epi16(p[0], _mm512_shuffle_epi8(table_lo, spread[0])),
                              p[1], _mm512_shuffle_epi8(table_lo, spread[1]));
      const __m512i t23 =
          _mm512_dpwssd_epi32(_mm512_madd_epi16(p[2], _mm512_shuffle_epi8(table_hi, spread[2])),
                              p[3], _mm512_shuffle_epi8(table_hi, spread[3]));
      // − 32 · Σ_s sc_s · S_s, in int32 lanes 0..7 (only the sum over lanes matters)
      const __m256i x_sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + 16 * b));
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, x_sums), 5);
      const __m512i total =
          _mm512_sub_epi32(_mm512_add_epi32(t01, t23), _mm512_zextsi256_si512(offset));
      a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(_cvtsh_ss(blk.d) * dx[b]), a);
    }
    acc[r] = a;
  }
  storeSums<kW>(acc, y, accumulate);
}

template <void (*kFour)(const unsigned char*, int64_t, int64_t, const int8_t*, const float*,
                        const int16_t*, float*, bool),
          void (*kOne)(const unsigned char*, int64_t, int64_t, const int8_t*, const float*,
                       const int16_t*, float*, bool)>
void gemvRows(const BlockWeights& w, int64_t n0, int64_t n1, const int8_t* q, const float* dx,
              const int16_t* sums, float* y, bool accumulate) {
  const int64_t blocks = w.cols / kQK;
  int64_t j = n0;
  for (; j + kRowsAtOnce <= n1; j += kRowsAtOnce)
    kFour(w.data + j * w.row_bytes, w.row_bytes, blocks, q, dx, sums, y + j, accumulate);
  for (; j < n1; ++j)
    kOne(w.data + j * w.row_bytes, w.row_bytes, blocks, q, dx, sums, y + j, accumulate);
}

}  // namespace

bool hasBlockGemv(WeightType type) {
  if (type != WeightType::Q4_K && type != WeightType::Q6_K) return false;
  static const bool available = q4kVnniAvailable(cpuFeatures());
  return available;
}

void blockGemv(const BlockWeights& w, int64_t n0, int64_t n1, const float* x, float* y,
               bool accumulate) {
  if (!hasBlockGemv(w.type)) {
    throw Error("blockGemv: no one-row kernel for " + std::string(weightTypeName(w.type)) +
                " on this CPU (a caller bug: check hasBlockGemv)");
  }
  if (w.cols % kQK != 0) {
    throw Error("blockGemv: " + std::to_string(w.cols) + " columns, not whole blocks of 256");
  }
  if (n1 <= n0) return;
  const bool q4 = w.type == WeightType::Q4_K;
  const int sub = q4 ? 32 : 16;
  const int64_t blocks = w.cols / kQK;
  // per-thread arenas 0 and 1, as the few-row kernels (callers hold no other slot across this)
  auto* q = static_cast<int8_t*>(threadArena(0, static_cast<size_t>(w.cols)));
  auto* dx = static_cast<float*>(threadArena(
      1, static_cast<size_t>(blocks) * (sizeof(float) + (kQK / sub) * sizeof(int16_t))));
  auto* sums = reinterpret_cast<int16_t*>(dx + blocks);
  quantiseRow(x, w.cols, q4, sub, q, dx, sums);
  if (q4) {
    gemvRows<q4kRows<kRowsAtOnce>, q4kRows<1>>(w, n0, n1, q, dx, sums, y, accumulate);
  } else {
    gemvRows<q6kRows<kRowsAtOnce>, q6kRows<1>>(w, n0, n1, q, dx, sums, y, accumulate);
  }
}

}  // namespace tandem::experts::kernels
