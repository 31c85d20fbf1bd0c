// quantizeGgml: ggml-quants.c's reference quantizers (quantize_row_q8_0_ref, _q5_0_ref, _q4_K_ref
// with make_qkx2_quants, quantize_row_q6_K_ref with make_qx_quants), the same arithmetic in the
// same order. Compiled with -ffp-contract=off like gguf_quant.cpp, so that ggml's separately
// rounded products stay separate.

#include "engine/io/gguf_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/core/ggml_blocks.h"

namespace tandem::io {
namespace {

using namespace ggml_blocks;  // NOLINT: the block structs of engine/core/ggml_blocks.h

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: a group this small is all zero

// ggml's nearest_int: round half to even (the default rounding mode), for |x| < 2^22.
int nearestInt(float x) { return static_cast<int>(std::lrintf(x)); }

void quantizeQ8_0(const float* x, BlockQ8_0& y) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y.d = floatToFp16(d);
  for (int j = 0; j < kQK; ++j) y.qs[j] = static_cast<int8_t>(std::lround(x[j] * id));
}

// quantize_row_q5_0_ref: d = max / -16 for the element of largest magnitude, 5-bit values biased
// by 16, the fifth bits gathered in qh.
void quantizeQ5_0(const float* x, BlockQ5_0& y) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -16;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y.d = floatToFp16(d);
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const float x0 = x[j] * id;
    const float x1 = x[kQK / 2 + j] * id;
    // ggml truncates through int8_t after adding 16.5 (round half up, then clamp to 31).
    const auto xi0 =
        static_cast<uint8_t>(std::min(31, static_cast<int>(static_cast<int8_t>(x0 + 16.5f))));
    const auto xi1 =
        static_cast<uint8_t>(std::min(31, static_cast<int>(static_cast<int8_t>(x1 + 16.5f))));
    y.qs[j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
    qh |= ((xi0 & 0x10u) >> 4) << j;
    qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
  }
  std::memcpy(y.qh, &qh, sizeof qh);
}

// make_qkx2_quants(n, nmax, x, weights, L, &min, Laux, rmin=-1, rdelta=0.1, nstep=20, mad=false):
// an asymmetric scale and min for one sub-block, searched over 21 candidate scales by weighted
// squared error. Returns the scale; *the_min is the (non-negative) offset subtracted.
float makeQkx2Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                     float* the_min, uint8_t* Laux) {
  constexpr float kRmin = -1.0f, kRdelta = 0.1f;
  constexpr int kSteps = 20;
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t{0});
    *the_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearestInt(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::clamp(l, 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  for (int is = 0; is <= kSteps; ++is) {
    iscale = (kRmin + kRdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearestInt(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * static_cast<float>(l);
      sum_l2 += w * static_cast<float>(l) * static_cast<float>(l);
      sum_xl += w * static_cast<float>(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float cur_error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * Laux[i] + this_min - x[i];
      cur_error += weights[i] * (diff * diff);
    }
    if (cur_error < best_error) {
      std::copy(Laux, Laux + n, L);
      best_error = cur_error;
      scale = this_scale;
      min = this_min;
    }
  }
  *the_min = -min;
  return scale;
}

// 256 elements: 8 sub-blocks of 32, each with a 6-bit scale and min relative to d and dmin.
void quantizeQ4K(const float* x, BlockQ4K& y) {
  uint8_t L[kQKK];
  uint8_t Laux[32];
  float weights[32];
  float mins[kQKK / 32];
  float scales[kQKK / 32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kQKK / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = makeQkx2Quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(y.scales, 0, sizeof y.scales);
  for (int j = 0; j < kQKK / 32; ++j) {
    const auto ls = static_cast<uint8_t>(std::min(63, nearestInt(inv_scale * scales[j])));
    const auto lm = static_cast<uint8_t>(std::min(63, nearestInt(inv_min * mins[j])));
    if (j < 4) {
      y.scales[j] = ls;
      y.scales[j + 4] = lm;
    } else {
      y.scales[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      y.scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      y.scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  y.d = floatToFp16(max_scale / 63.f);
  y.dmin = floatToFp16(max_min / 63.f);
  for (int j = 0; j < kQKK / 32; ++j) {
    uint8_t sc, m;
    scaleMinK4(j, y.scales, &sc, &m);
    const float d = fp16ToFloat(y.d) * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = fp16ToFloat(y.dmin) * static_cast<float>(m);
    for (int ii = 0; ii < 32; ++ii) {
      L[32 * j + ii] =
          static_cast<uint8_t>(std::clamp(nearestInt((x[32 * j + ii] + dm) / d), 0, 15));
    }
  }
  uint8_t* q = y.qs;
  for (int j = 0; j < kQKK; j += 64) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    q += 32;
  }
}

// make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL): a symmetric scale for one sub-block,
// searched over 19 candidates weighted by x² (L holds l + nmax).
float makeQxQuants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.f;
  }
  auto accumulate = [&](float iscale, float& sumlx, float& suml2) {
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearestInt(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * static_cast<float>(l);
      suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
  };
  auto store = [&](float iscale) {
    for (int i = 0; i < n; ++i) {
      L[i] = static_cast<int8_t>(nmax + std::clamp(nearestInt(iscale * x[i]), -nmax, nmax - 1));
    }
  };
  float iscale = -static_cast<float>(nmax) / max;
  float sumlx, suml2;
  accumulate(iscale, sumlx, suml2);
  store(iscale);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    accumulate(iscale, sumlx, suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      store(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// 256 elements: 16 sub-blocks of 16 with int8 scales relative to d; 6-bit values.
void quantizeQ6K(const float* x, BlockQ6K& y) {
  int8_t L[kQKK];
  float scales[kQKK / 16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < kQKK / 16; ++ib) {
    const float scale = makeQxQuants(16, 32, x + 16 * ib, L + 16 * ib);
    scales[ib] = scale;
    if (std::fabs(scale) > max_abs_scale) {
      max_abs_scale = std::fabs(scale);
      max_scale = scale;
    }
  }
  std::memset(&y, 0, sizeof y);
  if (max_abs_scale < kGroupMaxEps) {
    y.d = floatToFp16(0.f);
    return;
  }
  const float iscale = -128.f / max_scale;
  y.d = floatToFp16(1 / iscale);
  for (int ib = 0; ib < kQKK / 16; ++ib) {
    y.scales[ib] = static_cast<int8_t>(std::min(127, nearestInt(iscale * scales[ib])));
  }
  for (int j = 0; j < kQKK / 16; ++j) {
    const float d = fp16ToFloat(y.d) * static_cast<float>(y.scales[j]);
    if (d == 0.0f) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = std::clamp(nearestInt(x[16 * j + ii] / d), -32, 31);
      L[16 * j + ii] = static_cast<int8_t>(l + 32);
    }
  }
  uint8_t* ql = y.ql;
  uint8_t* qh = y.qh;
  for (int j = 0; j < kQKK; j += 128) {
    for (int l = 0; l < 32; ++l) {
      const auto q = [&](int k) { return static_cast<uint8_t>(L[j + l + k]); };
      ql[l] = static_cast<uint8_t>((q(0) & 0xF) | ((q(64) & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((q(32) & 0xF) | ((q(96) & 0xF) << 4));
      qh[l] = static_cast<uint8_t>((q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) |
                                   ((q(96) >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

template <typename Block, typename Quantize>
void forEachBlock(std::span<const float> values, std::span<std::byte> out, int block_elems,
                  Quantize quantize) {
  const size_t n_blocks = values.size() / static_cast<size_t>(block_elems);
  for (size_t i = 0; i < n_blocks; ++i) {
    Block block;
    quantize(values.data() + i * static_cast<size_t>(block_elems), block);
    std::memcpy(out.data() + i * sizeof(Block), &block, sizeof(Block));
  }
}

}  // namespace

bool ggmlQuantizable(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q5_0:
    case GgmlType::Q4_K:
    case GgmlType::Q6_K: return true;
    default: return false;
  }
}

uint64_t ggmlBytes(GgmlType type, int64_t numel) {
  const std::optional<GgmlTypeTraits> traits = ggmlTypeTraits(static_cast<uint32_t>(type));
  if (!traits) return 0;
  return static_cast<uint64_t>(numel / traits->block_elems) *
         static_cast<uint64_t>(traits->block_bytes);
}

void quantizeGgml(GgmlType type, std::span<const float> values, std::span<std::byte> out,
                  std::string_view what) {
  const std::optional<GgmlTypeTraits> traits = ggmlTypeTraits(static_cast<uint32_t>(type));
  if (!traits || !ggmlQuantizable(type)) {
    throw Error(std::string(what) + ": Tandem cannot write ggml type " +
                    (traits ? std::string(traits->name) : std::to_string(static_cast<int>(type))),
                "choose f16, q8_0 or q4_k_m");
  }
  const auto numel = static_cast<int64_t>(values.size());
  if (numel % traits->block_elems != 0) {
    throw Error(std::string(what) + ": " + std::to_string(numel) +
                    " elements is not a whole number of " + std::string(traits->name) +
                    " blocks of " + std::to_string(traits->block_elems),
                "internal error: the exporter should have chosen another type for this tensor");
  }
  if (out.size() != ggmlBytes(type, numel)) {
    throw Error(std::string(what) + ": output buffer of " + std::to_string(out.size()) +
                " bytes for " + std::to_string(ggmlBytes(type, numel)));
  }
  const int block_elems = static_cast<int>(traits->block_elems);
  switch (type) {
    case GgmlType::F32: std::memcpy(out.data(), values.data(), out.size()); return;
    case GgmlType::F16: {
      for (size_t i = 0; i < values.size(); ++i) {
        const uint16_t bits = floatToFp16(values[i]);
        std::memcpy(out.data() + 2 * i, &bits, 2);
      }
      return;
    }
    case GgmlType::BF16: {
      for (size_t i = 0; i < values.size(); ++i) {
        const uint16_t bits = floatToBf16(values[i]);
        std::memcpy(out.data() + 2 * i, &bits, 2);
      }
      return;
    }
    case GgmlType::Q8_0: forEachBlock<BlockQ8_0>(values, out, block_elems, quantizeQ8_0); return;
    case GgmlType::Q5_0: forEachBlock<BlockQ5_0>(values, out, block_elems, quantizeQ5_0); return;
    case GgmlType::Q4_K: forEachBlock<BlockQ4K>(values, out, block_elems, quantizeQ4K); return;
    case GgmlType::Q6_K: forEachBlock<BlockQ6K>(values, out, block_elems, quantizeQ6K); return;
    default: break;
  }
}

}  // namespace tandem::io
