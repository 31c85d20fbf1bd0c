#pragma once
// Kimi-K2's native INT4 checkpoints: compressed-tensors "pack-quantized" (config.json
// quantization_config {quant_method: compressed-tensors, format: pack-quantized, config_groups:
// {weights: {num_bits: 4, group_size: 32, symmetric: true, type: int}}}), read into Tandem int4
// tables (expert_blocks.h, Int4Spec{32, symmetric}) without dequantising. A Linear X whose weight
// is W [rows, cols] is stored as three tensors:
//   X.weight_packed  int32 [rows, ceil(cols / 8)]: element c of a row in bits 4·(c % 8) .. +3
//                    of word c / 8 (little-endian: byte c / 2, the low nibble for even c), as
//                    u = q + 8
//   X.weight_scale   bf16 (or f16) [rows, ceil(cols / 32)]: one scale per group of 32 inputs
//   X.weight_shape   int64 (or int32) [2]: {rows, cols}
// and W[r][c] = scale[r][c / 32] · (u − 8) (compressed-tensors' unpack_from_int32 + dequantize).
//
// Tandem's symmetric int4 has the same zero point (w = d · (q − 8), q = u) but keeps d in front of
// its group and elements j and j + 16 of a group in one byte (ggml's order): the nibbles are moved,
// never requantised, and d is the scale as f16. bf16 → f16 is exact for |scale| in [2^-14, 65504],
// where a real checkpoint's scales lie (weights of magnitude 1e-4 .. 1e5); smaller ones round to
// f16's subnormal grid (absolute error ≤ 2^-25 per scale); larger ones are refused.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/experts/expert_types.h"

namespace tandem::experts {

inline constexpr int kPackedInt4Group = 32;  // the only group size read (Kimi-K2's)

// One stored tensor as the file describes it; bytes must be exactly numel · dtype size. The dtype
// is the safetensors spelling ("I32", "BF16", ...): the expert engine does not depend on engine/io.
struct StoredTensor {
  std::string name;  // for messages: "model.layers.1.mlp.experts.0.up_proj.weight_packed"
  std::string dtype = "I32";
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
};

// The three tensors of one pack-quantized weight.
struct PackedInt4Weight {
  StoredTensor packed, scale, shape;
};

// The Int4Spec of the tables repackPackedInt4 writes.
inline Int4Spec packedInt4Spec() { return Int4Spec{kPackedInt4Group, true}; }

// Error naming the tensor at fault and what to do unless the three tensors hold W [rows, cols]:
// dtypes (packed int32, scale bf16/f16, shape int64/int32), shapes, byte sizes, and
// weight_shape's values against [rows, cols] (the model's config) and the packed width.
// whole_groups: cols must also be a multiple of 32 (a Tandem int4 table has whole groups).
void checkPackedInt4(const PackedInt4Weight& weight, int64_t rows, int64_t cols, bool whole_groups);

// W [rows, cols] as a Tandem int4 table (blockTableBytes(INT4, packedInt4Spec(), rows, cols)
// bytes at `out`), its nibbles moved and its scales converted to f16. Checks first
// (checkPackedInt4, whole groups); Error for a scale f16 cannot hold (non-finite, or beyond
// 65504), naming the tensor and the group.
void repackPackedInt4(const PackedInt4Weight& weight, int64_t rows, int64_t cols, void* out);

// W [rows, cols] in f32 at `out` (rows · cols floats) by the definition above, for weights that are
// not routed experts (dense parts may be dequantised) and as the reference in tests. Checks first
// (cols need not be a multiple of 32: the last group may be partial).
void dequantisePackedInt4(const PackedInt4Weight& weight, int64_t rows, int64_t cols, float* out);

}  // namespace tandem::experts
