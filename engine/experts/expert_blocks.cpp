#include "engine/experts/expert_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"

namespace tandem::experts {

bool isBlockType(WeightType type) {
  switch (type) {
    case WeightType::F32:
    case WeightType::BF16:
    case WeightType::F16:
    case WeightType::FP8_E4M3: return false;
    default: return true;
  }
}

void checkInt4Spec(const Int4Spec& int4) {
  if (int4.group != 32 && int4.group != 64 && int4.group != 128) {
    throw Error("int4 group size " + std::to_string(int4.group) + " is not supported",
                "use experts_int4_group 32, 64 or 128");
  }
}

BlockLayout blockLayout(WeightType type, const Int4Spec& int4) {
  switch (type) {
    case WeightType::Q8_0: return {32, 34};
    case WeightType::Q4_0: return {32, 18};
    case WeightType::Q4_K: return {256, 144};
    case WeightType::Q5_K: return {256, 176};
    case WeightType::Q6_K: return {256, 210};
    case WeightType::IQ4_XS: return {256, 136};
    case WeightType::MXFP4: return {32, 17};
    case WeightType::INT4: return {int4.group, (int4.symmetric ? 2 : 4) + int4.group / 2};
    default: return {1, weightTypeBytes(type)};
  }
}

uint64_t blockTableBytes(WeightType type, const Int4Spec& int4, int64_t rows, int64_t cols,
                         std::string_view what) {
  if (type == WeightType::INT4) checkInt4Spec(int4);
  const BlockLayout layout = blockLayout(type, int4);
  if (rows < 0 || cols < 0 || cols % layout.elems != 0) {
    throw Error(std::string(what) + ": " + std::to_string(cols) + " inputs per row are not a " +
                    "whole number of " + std::string(weightTypeName(type)) + " blocks of " +
                    std::to_string(layout.elems),
                "the tensor's shape does not match its block type; re-quantise the model (or "
                "choose an int4 group that divides the input size)");
  }
  return static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols / layout.elems) *
         static_cast<uint64_t>(layout.bytes);
}

void checkBlockTable(WeightType type, const Int4Spec& int4, int64_t rows, int64_t cols,
                     uint64_t table_bytes, std::string_view what) {
  const uint64_t expected = blockTableBytes(type, int4, rows, cols, what);
  if (table_bytes != expected) {
    throw Error(std::string(what) + ": its " + std::string(weightTypeName(type)) + " table has " +
                    std::to_string(table_bytes) + " bytes but [" + std::to_string(rows) + ", " +
                    std::to_string(cols) + "] needs " + std::to_string(expected),
                "the file's expert tensor does not match the model's shape; re-convert the model");
  }
}

WeightType expertWeightTypeOfGgml(uint32_t ggml_type, std::string_view ggml_name,
                                  std::string_view what) {
  // ggml_type values (ggml.h; engine/io/gguf.h GgmlType), a stable file format.
  switch (ggml_type) {
    case 0: return WeightType::F32;
    case 1: return WeightType::F16;
    case 30: return WeightType::BF16;
    case 8: return WeightType::Q8_0;
    case 2: return WeightType::Q4_0;
    case 12: return WeightType::Q4_K;
    case 13: return WeightType::Q5_K;
    case 14: return WeightType::Q6_K;
    case 23: return WeightType::IQ4_XS;
    case 39: return WeightType::MXFP4;
    default: break;
  }
  throw Error(std::string(what) + ": expert weights in ggml type " + std::string(ggml_name) +
                  " cannot be computed on their blocks",
              "re-quantise the model with llama-quantize to Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0, "
              "IQ4_XS or MXFP4 (or load it with experts_format bf16 / int8, which dequantises "
              "the experts at load)");
}

std::string_view expertFormatName(WeightFormat format, WeightType stored) {
  return format == WeightFormat::Blocks ? weightTypeName(stored) : weightFormatName(format);
}

void quantiseInt4(const float* w, int64_t rows, int64_t cols, const Int4Spec& int4, void* out) {
  checkInt4Spec(int4);
  const int group = int4.group;
  if (cols % group != 0) {
    throw Error("int4: " + std::to_string(cols) + " inputs per row are not a whole number of " +
                    "groups of " + std::to_string(group),
                "choose experts_int4_group 32, 64 or 128 that divides the input size");
  }
  const BlockLayout layout = blockLayout(WeightType::INT4, int4);
  auto* block = static_cast<unsigned char*>(out);
  std::vector<uint8_t> q(static_cast<size_t>(group));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g0 = 0; g0 < cols; g0 += group, block += layout.bytes) {
      const float* x = w + r * cols + g0;
      float lo = x[0], hi = x[0], amax = 0.0f;
      for (int j = 0; j < group; ++j) {
        lo = std::min(lo, x[j]);
        hi = std::max(hi, x[j]);
        amax = std::max(amax, std::fabs(x[j]));
      }
      uint16_t d_bits, m_bits = 0;
      if (int4.symmetric) {
        d_bits = floatToFp16(amax / 7.0f);
        const float d = fp16ToFloat(d_bits);
        const float inv = d > 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < group; ++j) {
          q[j] = static_cast<uint8_t>(std::clamp(std::lrintf(x[j] * inv), -8L, 7L) + 8);
        }
        std::memcpy(block, &d_bits, 2);
      } else {
        d_bits = floatToFp16((hi - lo) / 15.0f);
        m_bits = floatToFp16(lo);
        const float d = fp16ToFloat(d_bits), m = fp16ToFloat(m_bits);
        const float inv = d > 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < group; ++j) {
          q[j] = static_cast<uint8_t>(std::clamp(std::lrintf((x[j] - m) * inv), 0L, 15L));
        }
        std::memcpy(block, &d_bits, 2);
        std::memcpy(block + 2, &m_bits, 2);
      }
      unsigned char* qs = block + (int4.symmetric ? 2 : 4);
      for (int j = 0; j < group / 2; ++j) {
        qs[j] = static_cast<unsigned char>(q[j] | (q[j + group / 2] << 4));
      }
    }
  }
}

}  // namespace tandem::experts
