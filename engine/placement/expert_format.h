#pragma once
// How the routed experts' frozen weights are held in memory, and their bytes: the plain formats
// (bf16, fp16, fp32), the quantised ones the engine makes at load (int8 per output row, Tandem int4
// per group) and those it keeps as the checkpoint stores them (DeepSeek's fp8 with 128 × 128
// scales, GGUF blocks, compressed-tensors int4). Plain arithmetic for the planner; the engine's own
// block structs are engine/io/gguf_quant.cpp and engine/experts.
//
// Names, as experts_format, kt rule files and `tandem plan` spell them:
//   bf16 fp16 fp32 int8 fp8
//   int4 int4:g64 int4:g128 int4:asym int4:g64:asym int4:g128:asym   (Tandem int4: groups of
//     32 / 64 / 128 weights along the input dimension, one 16-bit scale each, and a 16-bit
//     minimum each when asymmetric; Kimi-K2's compressed-tensors checkpoints are `int4`)
//   q8_0 q4_0 q4_k q5_k q6_k iq4_xs mxfp4                            (GGUF blocks, as stored)

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::placement {

struct ExpertFormat {
  std::string name;
  int64_t block_weights = 1;      // weights per block along a matrix row (its input dimension)
  int64_t block_bytes = 2;        // bytes of one block: its values and its own scales / minimums
  bool row_scales = false;        // int8: + one f32 scale per output row
  bool fp8_block_scales = false;  // fp8: + DeepSeek's [ceil(out/128), ceil(in/128)] f32 scales
  // The expert kernels compute on the blocks as they are (4-bit and GGUF formats): the backward
  // reads the same blocks, so there is no transposed copy (Wᵀ) and no f32 copy of the weights.
  bool computed_as_stored = false;

  // Bytes of one [rows, cols] matrix, blocks along cols (cols a multiple of block_weights).
  uint64_t matrixBytes(int64_t rows, int64_t cols) const;
  double bitsPerWeight() const;
};

// Throws Error naming the formats when `name` is not one.
ExpertFormat expertFormat(std::string_view name);
bool isExpertFormat(std::string_view name);
std::vector<std::string> expertFormatNames();
// The Tandem int4 name for a group size (32, 64 or 128; else Error) and symmetry.
std::string int4FormatName(int64_t group_size, bool symmetric);

}  // namespace tandem::placement
