#pragma once
// Block weights decoded straight to bf16 rows (avx512_bf16/block_decode_bf16.cpp, AVX-512
// F/BW/VL/DQ
// + AVX512_BF16): the feed of the bf16 block backends, amx_blocks and avx512_bf16_blocks. A row's
// blocks become bf16 in stored order; the backends lay those rows into their own tiles (AMX's
// A operand as they are, VNNI pairs of two rows, ...). Callers check CpuFeatures::canUseAvx512Bf16.

#include <cstdint>

#include "engine/experts/expert_types.h"

namespace tandem::experts::kernels {

// out [n_blocks · elems] bf16 = the blocks of one row, each element the f32 value
// dequantBlocksAvx512 gives, rounded to nearest even. INT4, Q4_0, Q4_K: decoded in registers
// (nibbles → f32 → bf16, Q4_K's eight scales and mins widened per block in one vector), no f32
// buffer; the other types through dequantBlocksAvx512, one block at a time in L1.
void dequantBlocksBf16(WeightType type, const Int4Spec& int4, const void* blocks, int64_t n_blocks,
                       uint16_t* out);

}  // namespace tandem::experts::kernels
