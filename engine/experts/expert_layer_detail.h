#pragma once
// Internals shared by expert_layer.cpp and expert_layer_backward.cpp; not part of the API.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "engine/core/float_convert.h"
#include "engine/experts/expert_routing.h"
#include "engine/experts/expert_types.h"

namespace tandem::experts::detail {

// Rows per (expert, row-block) task. Large enough that a block amortises streaming the expert's
// weights, small enough that a hot expert splits into several stealable tasks.
inline constexpr int64_t kRowBlock = 32;

// Per-thread scratch for one task (grows, never shrinks): tasks never nest, so one buffer per
// thread suffices and no task mallocs per row.
inline float* threadScratch(size_t n_floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < n_floats) buffer.resize(n_floats);
  return buffer.data();
}

// dst [width] f32 = row `row` of src [*, width] act_type.
inline void rowToFloat(const void* src, ActivationType type, int64_t row, int64_t width,
                       float* dst) {
  if (type == ActivationType::F32) {
    std::memcpy(dst, static_cast<const float*>(src) + row * width, width * sizeof(float));
  } else {
    const uint16_t* bits = static_cast<const uint16_t*>(src) + row * width;
    bf16ToFloat(std::span<const uint16_t>(bits, width), std::span<float>(dst, width));
  }
}

// Row `row` of dst [*, width] act_type = src [width] f32 (bf16: round to nearest even).
inline void rowFromFloat(const float* src, ActivationType type, void* dst, int64_t row,
                         int64_t width) {
  if (type == ActivationType::F32) {
    std::memcpy(static_cast<float*>(dst) + row * width, src, width * sizeof(float));
  } else {
    uint16_t* bits = static_cast<uint16_t*>(dst) + row * width;
    floatToBf16(std::span<const float>(src, width), std::span<uint16_t>(bits, width));
  }
}

// dst [end - begin, width] f32: the token rows of sorted positions [begin, end) of src.
inline void gatherRows(const void* src, ActivationType type, const ExpertRouting& routing,
                       int64_t begin, int64_t end, int64_t width, float* dst) {
  for (int64_t pos = begin; pos < end; ++pos) {
    rowToFloat(src, type, routing.tokenOf(pos), width, dst + (pos - begin) * width);
  }
}

inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace tandem::experts::detail
