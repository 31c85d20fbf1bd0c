#pragma once
// Expert weights held as tables of blocks along the input dimension: a GGUF file's block types
// (ggml's structs, engine/core/ggml_blocks.h, read where the file is mapped) and Tandem's int4
// (Int4Spec, made here at load). A matrix W [out, in] is `out` rows, each in / block_elems
// consecutive blocks; the kernels (kernels/block_kernels.h) dequantise tiles of it on the fly.
//
// Tandem int4 blocks, one per group of G inputs (G = Int4Spec::group), little-endian:
//   symmetric   { f16 d;          u8 qs[G/2] }   w = d · (q − 8)     (G = 32: ggml's Q4_0 block)
//   asymmetric  { f16 d; f16 m;   u8 qs[G/2] }   w = d · q + m       (G = 32: ggml's Q4_1 block)
// with element j in the low nibble of qs[j] and element j + G/2 in its high nibble (ggml's order).

#include <cstdint>
#include <memory>
#include <string_view>

#include "engine/experts/expert_types.h"

namespace tandem::experts {

bool isBlockType(WeightType type);

// Elements and bytes of one block of `type` (int4: of the group `int4` describes).
struct BlockLayout {
  int64_t elems = 0;
  int64_t bytes = 0;
};
BlockLayout blockLayout(WeightType type, const Int4Spec& int4 = {});

// Bytes of the table of W [rows, cols] in `type`; Error when cols is not a whole number of
// blocks (naming `what`).
uint64_t blockTableBytes(WeightType type, const Int4Spec& int4, int64_t rows, int64_t cols,
                         std::string_view what);

// Error naming `what` unless a table of `table_bytes` holds exactly W [rows, cols] in `type`:
// the check that stands between a file's claims and every block read.
void checkBlockTable(WeightType type, const Int4Spec& int4, int64_t rows, int64_t cols,
                     uint64_t table_bytes, std::string_view what);

// Error unless group is 32, 64 or 128.
void checkInt4Spec(const Int4Spec& int4);

// The expert engine's type for a ggml type number (engine/io/gguf.h GgmlType): F32, F16, BF16 and
// the block types above. Anything else is an Error naming the type (ggml_name, the caller's
// ggmlTypeName) and `what` (the tensor), with the types to re-quantise to.
WeightType expertWeightTypeOfGgml(uint32_t ggml_type, std::string_view ggml_name,
                                  std::string_view what);

// The name the planner sizes a layer's experts by: "bf16", "int8", "int4", or the block type's
// lower-case GGUF name ("q4_k", ...) for WeightFormat::Blocks.
std::string_view expertFormatName(WeightFormat format, WeightType stored);

// Quantises W [rows, cols] f32 into Tandem int4 blocks (blockTableBytes(INT4, int4, rows, cols)
// bytes at `out`). Symmetric: d = amax / 7 (q − 8 in [−8, 7]); asymmetric: d = (max − min) / 15,
// m = min; q rounds to nearest against the f16-rounded d and m, so dequantising reproduces the
// values the quantiser chose. cols must be a multiple of the group.
void quantiseInt4(const float* w, int64_t rows, int64_t cols, const Int4Spec& int4, void* out);

// Tandem int4 tables of every expert, made at layer creation (WeightFormat::Int4 on element-type
// views): owns them and hands out INT4 views in place of the originals.
class Int4ExpertTables {
 public:
  // Dequantises each view (bf16, f16, f32, fp8 with its scales, or a block type) to f32, one
  // matrix at a time, and quantises it. Views already INT4 are not accepted (use them as they are).
  Int4ExpertTables(const ExpertLayerSpec& spec, const ExpertWeightViews& views,
                   const Int4Spec& int4);
  ~Int4ExpertTables();
  Int4ExpertTables(const Int4ExpertTables&) = delete;
  Int4ExpertTables& operator=(const Int4ExpertTables&) = delete;

  const ExpertWeightViews& views() const { return views_; }
  uint64_t bytes() const { return bytes_; }

 private:
  ExpertWeightViews views_;
  std::unique_ptr<unsigned char[]> storage_;
  uint64_t bytes_ = 0;
};

}  // namespace tandem::experts
