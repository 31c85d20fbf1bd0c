// dequantizeGgml: ggml's block formats (ggml-common.h) to fp32, with the arithmetic of ggml's
// reference dequantize_row_* (ggml-quants.c): the same products in the same order, each rounded
// to float, so the results are bit-identical to ggml's and to gguf-py's numpy versions. This file
// is compiled with -ffp-contract=off so that `d * q - m` is never fused into one rounding.
//
// Each block is memcpy'd into its struct: tensors in a mapped file are only as aligned as the
// file's alignment, and the structs hold uint16_t/float fields.

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <string>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/core/ggml_blocks.h"
#include "engine/io/gguf.h"

namespace tandem::io {

namespace {

using namespace ggml_blocks;  // NOLINT: the block structs and decoders of engine/core/ggml_blocks.h

template <typename Block, typename Decode>
void forEachBlock(std::span<const std::byte> bytes, int block_elems, float* out, Decode decode) {
  const size_t n_blocks = bytes.size() / sizeof(Block);
  for (size_t i = 0; i < n_blocks; ++i) {
    Block block;
    std::memcpy(&block, bytes.data() + i * sizeof(Block), sizeof(Block));
    decode(block, out + i * static_cast<size_t>(block_elems));
  }
}

// Plain element types, converted value by value (integers as their values, F64 rounded).
template <typename Element, typename Convert>
void convertElements(std::span<const std::byte> bytes, float* out, Convert convert) {
  const size_t n = bytes.size() / sizeof(Element);
  for (size_t i = 0; i < n; ++i) {
    Element value;
    std::memcpy(&value, bytes.data() + i * sizeof(Element), sizeof(Element));
    out[i] = convert(value);
  }
}

// fp16 through the bulk converter, a chunk at a time so that unaligned input is fine.
void convertFp16(std::span<const std::byte> bytes, float* out) {
  constexpr size_t kChunk = 1024;
  std::array<uint16_t, kChunk> bits;
  const size_t n = bytes.size() / 2;
  for (size_t start = 0; start < n; start += kChunk) {
    const size_t count = std::min(kChunk, n - start);
    std::memcpy(bits.data(), bytes.data() + 2 * start, 2 * count);
    fp16ToFloat(std::span<const uint16_t>(bits.data(), count),
                std::span<float>(out + start, count));
  }
}

}  // namespace

void dequantizeGgml(GgmlType type, std::span<const std::byte> bytes, int64_t numel, float* out,
                    std::string_view what) {
  const std::optional<GgmlTypeTraits> traits = ggmlTypeTraits(static_cast<uint32_t>(type));
  if (!traits) {
    throw Error(
        std::string(what) + ": unknown ggml type " + std::to_string(static_cast<uint32_t>(type)),
        "the file is corrupt or newer than this reader; re-convert it with llama.cpp");
  }
  if (!traits->dequantizable) {
    throw Error(
        std::string(what) + ": ggml type " + std::string(traits->name) +
            " has no dequantizer in Tandem (its codebook grids are not implemented)",
        "re-quantize the model with llama.cpp's llama-quantize to Q4_K_M, Q5_K_M, Q6_K or Q8_0");
  }
  if (numel < 0 || numel % traits->block_elems != 0) {
    throw Error(std::string(what) + ": " + std::to_string(numel) +
                    " elements is not a whole number of " + std::string(traits->name) +
                    " blocks of " + std::to_string(traits->block_elems),
                "the tensor's shape does not match its type; re-convert the file");
  }
  const auto expected_bytes = static_cast<uint64_t>(numel / traits->block_elems) *
                              static_cast<uint64_t>(traits->block_bytes);
  if (bytes.size() != expected_bytes) {
    throw Error(std::string(what) + ": has " + std::to_string(bytes.size()) + " bytes but " +
                    std::to_string(numel) + " " + std::string(traits->name) + " elements need " +
                    std::to_string(expected_bytes),
                "the tensor's bytes do not match its shape; re-convert the file");
  }
  const int block_elems = static_cast<int>(traits->block_elems);
  switch (type) {
    case GgmlType::F32:
      if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
      return;
    case GgmlType::F16: convertFp16(bytes, out); return;
    case GgmlType::BF16:
      convertElements<uint16_t>(bytes, out, [](uint16_t v) { return bf16ToFloat(v); });
      return;
    case GgmlType::F64:
      convertElements<double>(bytes, out, [](double v) { return static_cast<float>(v); });
      return;
    case GgmlType::I8:
      convertElements<int8_t>(bytes, out, [](int8_t v) { return static_cast<float>(v); });
      return;
    case GgmlType::I16:
      convertElements<int16_t>(bytes, out, [](int16_t v) { return static_cast<float>(v); });
      return;
    case GgmlType::I32:
      convertElements<int32_t>(bytes, out, [](int32_t v) { return static_cast<float>(v); });
      return;
    case GgmlType::I64:
      convertElements<int64_t>(bytes, out, [](int64_t v) { return static_cast<float>(v); });
      return;
    case GgmlType::Q4_0: forEachBlock<BlockQ4_0>(bytes, block_elems, out, dequantizeQ4_0); return;
    case GgmlType::Q4_1: forEachBlock<BlockQ4_1>(bytes, block_elems, out, dequantizeQ4_1); return;
    case GgmlType::Q5_0: forEachBlock<BlockQ5_0>(bytes, block_elems, out, dequantizeQ5_0); return;
    case GgmlType::Q5_1: forEachBlock<BlockQ5_1>(bytes, block_elems, out, dequantizeQ5_1); return;
    case GgmlType::Q8_0: forEachBlock<BlockQ8_0>(bytes, block_elems, out, dequantizeQ8_0); return;
    case GgmlType::Q2_K: forEachBlock<BlockQ2K>(bytes, block_elems, out, dequantizeQ2K); return;
    case GgmlType::Q3_K: forEachBlock<BlockQ3K>(bytes, block_elems, out, dequantizeQ3K); return;
    case GgmlType::Q4_K: forEachBlock<BlockQ4K>(bytes, block_elems, out, dequantizeQ4K); return;
    case GgmlType::Q5_K: forEachBlock<BlockQ5K>(bytes, block_elems, out, dequantizeQ5K); return;
    case GgmlType::Q6_K: forEachBlock<BlockQ6K>(bytes, block_elems, out, dequantizeQ6K); return;
    case GgmlType::Q8_K: forEachBlock<BlockQ8K>(bytes, block_elems, out, dequantizeQ8K); return;
    case GgmlType::IQ4_NL:
      forEachBlock<BlockIq4Nl>(bytes, block_elems, out, dequantizeIq4Nl);
      return;
    case GgmlType::IQ4_XS:
      forEachBlock<BlockIq4Xs>(bytes, block_elems, out, dequantizeIq4Xs);
      return;
    case GgmlType::MXFP4:
      forEachBlock<BlockMxfp4>(bytes, block_elems, out, dequantizeMxfp4);
      return;
    default: break;
  }
  throw Error(std::string(what) + ": internal error: ggml type " + std::string(traits->name) +
              " is marked dequantizable but has no dequantizer");
}

}  // namespace tandem::io
