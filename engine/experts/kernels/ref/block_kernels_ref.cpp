// ref::dequantBlocks, the specification of every block dequantiser: ggml's block structs and
// per-block decoders (engine/core/ggml_blocks.h, the code dequantizeGgml runs) for the GGUF types,
// and Tandem int4 (expert_blocks.h). Compiled with -ffp-contract=off, so the GGUF types are
// bit-identical to ggml's dequantize_row_* and to gguf-py's gguf.quants.dequantize.

#include <cstring>

#include "engine/core/float_convert.h"
#include "engine/core/ggml_blocks.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace tandem::experts::kernels::ref {

namespace {

namespace gb = ggml_blocks;

template <typename Block, typename Decode>
void eachBlock(const void* blocks, int64_t n_blocks, int64_t block_elems, float* out,
               Decode decode) {
  const auto* bytes = static_cast<const unsigned char*>(blocks);
  for (int64_t i = 0; i < n_blocks; ++i) {
    Block block;  // memcpy: a mapped file's blocks are only as aligned as the file
    std::memcpy(&block, bytes + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
    decode(block, out + i * block_elems);
  }
}

// One Tandem int4 group: d [, m] then G/2 bytes, element j low nibble of qs[j], j + G/2 high.
void dequantInt4(const Int4Spec& int4, const void* blocks, int64_t n_blocks, float* out) {
  const BlockLayout layout = blockLayout(WeightType::INT4, int4);
  const int half_group = int4.group / 2;
  const auto* block = static_cast<const unsigned char*>(blocks);
  for (int64_t i = 0; i < n_blocks; ++i, block += layout.bytes, out += int4.group) {
    uint16_t d_bits, m_bits = 0;
    std::memcpy(&d_bits, block, 2);
    if (!int4.symmetric) std::memcpy(&m_bits, block + 2, 2);
    const float d = fp16ToFloat(d_bits), m = fp16ToFloat(m_bits);
    const unsigned char* qs = block + (int4.symmetric ? 2 : 4);
    for (int j = 0; j < half_group; ++j) {
      const int lo = qs[j] & 0xF, hi = qs[j] >> 4;
      if (int4.symmetric) {
        out[j] = static_cast<float>(lo - 8) * d;
        out[j + half_group] = static_cast<float>(hi - 8) * d;
      } else {
        out[j] = static_cast<float>(lo) * d + m;
        out[j + half_group] = static_cast<float>(hi) * d + m;
      }
    }
  }
}

}  // namespace

void dequantBlocks(WeightType type, const Int4Spec& int4, const void* blocks, int64_t n_blocks,
                   float* out) {
  switch (type) {
    case WeightType::Q8_0:
      return eachBlock<gb::BlockQ8_0>(blocks, n_blocks, gb::kQK, out, gb::dequantizeQ8_0);
    case WeightType::Q4_0:
      return eachBlock<gb::BlockQ4_0>(blocks, n_blocks, gb::kQK, out, gb::dequantizeQ4_0);
    case WeightType::MXFP4:
      return eachBlock<gb::BlockMxfp4>(blocks, n_blocks, gb::kQK, out, gb::dequantizeMxfp4);
    case WeightType::Q4_K:
      return eachBlock<gb::BlockQ4K>(blocks, n_blocks, gb::kQKK, out, gb::dequantizeQ4K);
    case WeightType::Q5_K:
      return eachBlock<gb::BlockQ5K>(blocks, n_blocks, gb::kQKK, out, gb::dequantizeQ5K);
    case WeightType::Q6_K:
      return eachBlock<gb::BlockQ6K>(blocks, n_blocks, gb::kQKK, out, gb::dequantizeQ6K);
    case WeightType::IQ4_XS:
      return eachBlock<gb::BlockIq4Xs>(blocks, n_blocks, gb::kQKK, out, gb::dequantizeIq4Xs);
    case WeightType::INT4: return dequantInt4(int4, blocks, n_blocks, out);
    default: return;  // element types never come here (isBlockType guards every caller)
  }
}

}  // namespace tandem::experts::kernels::ref
