#include "engine/experts/packed_int4.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/experts/expert_blocks.h"

namespace tandem::experts {

namespace {

// The packed words are read as the file's little-endian bytes; every platform Tandem builds for is
// little-endian.
static_assert(std::endian::native == std::endian::little);

constexpr int kValuesPerWord = 8;  // int4 values in one int32 word of weight_packed
constexpr int kGroupBytes = kPackedInt4Group / 2;

const char* const kReexport =
    "the checkpoint is not what compressed-tensors' pack-quantized format writes: re-download it, "
    "or load a bf16 copy of the model";

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of one element of the dtypes the three tensors may have.
uint64_t dtypeBytes(const std::string& dtype) {
  return dtype == "I64" ? 8 : dtype == "I32" ? 4 : 2;  // BF16, F16
}

void checkTensor(const StoredTensor& t, std::initializer_list<const char*> dtypes,
                 const std::vector<int64_t>& shape, const std::string& why) {
  bool dtype_ok = false;
  std::string allowed;
  for (const char* d : dtypes) {
    dtype_ok = dtype_ok || t.dtype == d;
    allowed += (allowed.empty() ? "" : " or ") + std::string(d);
  }
  if (!dtype_ok) {
    throw Error("tensor " + t.name + " is " + t.dtype + ", but a " +
                    "pack-quantized int4 weight stores it as " + allowed,
                kReexport);
  }
  if (t.shape != shape) {
    throw Error("tensor " + t.name + " has shape " + shapeText(t.shape) + ", but " + why +
                    " needs " + shapeText(shape),
                kReexport);
  }
  uint64_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
  if (t.bytes.size() != numel * dtypeBytes(t.dtype)) {
    throw Error("tensor " + t.name + " holds " + std::to_string(t.bytes.size()) + " bytes, but " +
                    shapeText(shape) + " " + t.dtype + " is " +
                    std::to_string(numel * dtypeBytes(t.dtype)),
                kReexport);
  }
}

int64_t shapeValue(const StoredTensor& shape, int i) {
  if (shape.dtype == "I64") {
    int64_t v;
    std::memcpy(&v, shape.bytes.data() + i * 8, 8);
    return v;
  }
  int32_t v;
  std::memcpy(&v, shape.bytes.data() + i * 4, 4);
  return v;
}

float scaleValue(const StoredTensor& scale, int64_t index) {
  uint16_t bits;
  std::memcpy(&bits, scale.bytes.data() + index * 2, 2);
  return scale.dtype == "BF16" ? bf16ToFloat(bits) : fp16ToFloat(bits);
}

// u (0..15) of element c of a row of weight_packed bytes.
int nibble(const unsigned char* row, int64_t c) { return (row[c / 2] >> (4 * (c % 2))) & 0xF; }

}  // namespace

void checkPackedInt4(const PackedInt4Weight& w, int64_t rows, int64_t cols, bool whole_groups) {
  checkTensor(w.shape, {"I64", "I32"}, {2}, "a weight_shape of {rows, cols}");
  const int64_t stored_rows = shapeValue(w.shape, 0), stored_cols = shapeValue(w.shape, 1);
  if (stored_rows != rows || stored_cols != cols) {
    throw Error(
        "tensor " + w.shape.name + " says the weight is " + shapeText({stored_rows, stored_cols}) +
            ", but config.json implies " + shapeText({rows, cols}),
        "the weights do not belong to this config.json: re-download or re-export the model");
  }
  if (rows <= 0 || cols <= 0) {
    throw Error("tensor " + w.shape.name + " says the weight is " + shapeText({rows, cols}),
                kReexport);
  }
  checkTensor(w.packed, {"I32"}, {rows, ceilDiv(cols, kValuesPerWord)},
              "weight_shape " + shapeText({rows, cols}) + " (int32 words of 8 int4 values)");
  checkTensor(w.scale, {"BF16", "F16"}, {rows, ceilDiv(cols, kPackedInt4Group)},
              "weight_shape " + shapeText({rows, cols}) + " (one scale per group of 32)");
  if (whole_groups && cols % kPackedInt4Group != 0) {
    throw Error("tensor " + w.packed.name + ": " + std::to_string(cols) +
                    " inputs per row are not whole groups of 32, which Tandem's int4 experts need",
                "load the model with experts_format bf16 (the experts are dequantised at load)");
  }
}

void repackPackedInt4(const PackedInt4Weight& w, int64_t rows, int64_t cols, void* out) {
  checkPackedInt4(w, rows, cols, /*whole_groups=*/true);
  const int64_t groups = cols / kPackedInt4Group;
  const BlockLayout layout = blockLayout(WeightType::INT4, packedInt4Spec());
  const auto* packed = reinterpret_cast<const unsigned char*>(w.packed.bytes.data());
  auto* block = static_cast<unsigned char*>(out);
  for (int64_t r = 0; r < rows; ++r) {
    const unsigned char* row = packed + r * (cols / 2);
    for (int64_t g = 0; g < groups; ++g, block += layout.bytes) {
      const float scale = scaleValue(w.scale, r * groups + g);
      const uint16_t d = floatToFp16(scale);
      if (!std::isfinite(scale) || !std::isfinite(fp16ToFloat(d))) {
        throw Error(
            "tensor " + w.scale.name + ": the scale of row " + std::to_string(r) + ", group " +
                std::to_string(g) + " is " + std::to_string(scale) +
                ", which Tandem's int4 (f16 scales up to 65504) cannot hold",
            "load the model with experts_format bf16 (the experts are dequantised at load)");
      }
      std::memcpy(block, &d, 2);
      const unsigned char* in = row + g * kGroupBytes;
      unsigned char* qs = block + 2;
      // Tandem int4: element j in the low nibble of qs[j], element j + 16 in its high nibble.
      for (int j = 0; j < kGroupBytes; ++j) {
        qs[j] = static_cast<unsigned char>(nibble(in, j) | (nibble(in, j + kGroupBytes) << 4));
      }
    }
  }
}

void dequantisePackedInt4(const PackedInt4Weight& w, int64_t rows, int64_t cols, float* out) {
  checkPackedInt4(w, rows, cols, /*whole_groups=*/false);
  const int64_t row_bytes = ceilDiv(cols, kValuesPerWord) * 4;
  const int64_t groups = ceilDiv(cols, kPackedInt4Group);
  const auto* packed = reinterpret_cast<const unsigned char*>(w.packed.bytes.data());
  for (int64_t r = 0; r < rows; ++r) {
    const unsigned char* row = packed + r * row_bytes;
    for (int64_t c = 0; c < cols; ++c) {
      const float scale = scaleValue(w.scale, r * groups + c / kPackedInt4Group);
      out[r * cols + c] = scale * static_cast<float>(nibble(row, c) - 8);
    }
  }
}

}  // namespace tandem::experts
