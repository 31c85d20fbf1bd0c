#pragma once
// Block weights decoded straight to bf16 rows (avx512_bf16/block_decode_bf16.cpp, AVX-512
// F/BW/VL/DQ + AVX512_BF16): the feed of the bf16 block backends, amx_blocks and
// avx512_bf16_blocks. A row's blocks become bf16 in stored order; the backends lay those rows into
// their own tiles (AMX's A operand as they are, VNNI pairs of two rows, ...). Callers check
// CpuFeatures::canUseAvx512Bf16.

#include <cstdint>
#include <memory>

#include "engine/experts/expert_blocks.h"
#include "engine/experts/expert_types.h"
#include "engine/experts/kernels/block_gemm.h"
#include "engine/experts/kernels/packed_gemm.h"

namespace tandem::experts::kernels {

// out [n_blocks · elems] bf16 = the blocks of one row, each element the f32 value
// dequantBlocksAvx512 gives, rounded to nearest even. INT4, Q4_0, Q4_K: decoded in registers
// (nibbles → f32 → bf16, Q4_K's eight scales and mins widened per block in one vector), no f32
// buffer; the other types through dequantBlocksAvx512, one block at a time in L1.
void dequantBlocksBf16(WeightType type, const Int4Spec& int4, const void* blocks, int64_t n_blocks,
                       uint16_t* out);

// What both bf16 block backends "pack": nothing, the block table read in place (B = W, or Wᵀ for
// the input gradient), decoded per call.
class Bf16BlockSource final : public PackedMatrix {
 public:
  Bf16BlockSource(int64_t n, int64_t k, const SourceMatrix& src, bool transposed)
      : PackedMatrix(n, k),
        src(src),
        layout(blockLayout(src.type, src.int4)),
        transposed(transposed) {}
  uint64_t bytes() const override { return 0; }
  const unsigned char* row(int64_t r) const {
    return static_cast<const unsigned char*>(src.data) + r * src.rowBytes();
  }
  // W's block table as the block kernels (block_gemm.h) read it.
  BlockWeights blocks() const {
    return {static_cast<const unsigned char*>(src.data),
            src.type,
            src.int4,
            src.rows,
            src.cols,
            src.rowBytes()};
  }
  SourceMatrix src;  // W [rows, cols] as blocks
  BlockLayout layout;
  bool transposed;  // B = Wᵀ
};

// The bf16 block backends' pack(): a view of `src` (B = W, or Wᵀ when transpose), refused by the
// backend's name for weights that are not blocks.
std::unique_ptr<PackedMatrix> bf16BlockSource(const SourceMatrix& src, bool transpose,
                                              const char* backend);

}  // namespace tandem::experts::kernels
