#pragma once
// fp32 to ggml's storage types, for writing GGUF files (the merged export, docs/export.md): the
// reverse of dequantizeGgml (gguf.h). The block quantizers follow ggml's reference
// quantize_row_*_ref (ggml-quants.c): Q8_0's and Q5_0's absmax scale, Q4_K's make_qkx2_quants
// search over scale and min per 32-element sub-block, Q6_K's make_qx_quants search per 16-element
// sub-block. They are what llama-quantize runs without an importance matrix.

#include <cstdint>
#include <span>

#include "engine/io/gguf.h"

namespace tandem::io {

// The types quantizeGgml writes: F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q6_K.
bool ggmlQuantizable(GgmlType type);

// The bytes `numel` elements take as `type` (numel a multiple of the type's block size).
uint64_t ggmlBytes(GgmlType type, int64_t numel);

// Converts values ([numel] fp32) into `out` (exactly ggmlBytes(type, numel) bytes). Error naming
// `what` when the type is not quantizable or numel is not a whole number of blocks.
void quantizeGgml(GgmlType type, std::span<const float> values, std::span<std::byte> out,
                  std::string_view what);

}  // namespace tandem::io
