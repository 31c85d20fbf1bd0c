// libFuzzer target for Kimi-K2's pack-quantized int4 weights (experts/packed_int4.h, issue 27): the
// three tensors' dtypes, shapes and sizes against the model's shape (checkPackedInt4), then the
// repack into a Tandem int4 table and the dequantisation over what the checks accept.
//
// Input: 1 byte each for the dtypes of weight_packed, weight_scale and weight_shape, then u16 rows
// and cols (the model's shape), u16 x 2 each for the shapes the packed and scale tensors claim,
// u8 the rank of weight_shape, u16 x 3 the byte lengths of the three tensors, then their bytes.
// Only tandem::Error may escape; each tensor lies in a heap buffer of exactly its claimed length,
// so a read past it is an AddressSanitizer finding, and the outputs are sized from rows and cols.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/core/error.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/packed_int4.h"

namespace {

constexpr const char* kDtypes[] = {"I32", "I64", "BF16", "F16", "F32", "U8", "I16"};

const char* dtypeOf(uint8_t byte) { return kDtypes[byte % (sizeof(kDtypes) / sizeof(kDtypes[0]))]; }

uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kHeader = 3 + 4 + 8 + 1 + 6;
  if (size < kHeader) return 0;
  const int64_t rows = u16(data + 3), cols = u16(data + 5);
  if (rows * cols > (int64_t{1} << 16)) return 0;  // keeps each run fast
  tandem::experts::PackedInt4Weight w;
  w.packed.name = "x.weight_packed";
  w.scale.name = "x.weight_scale";
  w.shape.name = "x.weight_shape";
  w.packed.dtype = dtypeOf(data[0]);
  w.scale.dtype = dtypeOf(data[1]);
  w.shape.dtype = dtypeOf(data[2]);
  w.packed.shape = {u16(data + 7), u16(data + 9)};
  w.scale.shape = {u16(data + 11), u16(data + 13)};
  w.shape.shape = std::vector<int64_t>(data[15] % 3, 2);
  // Exactly the claimed bytes of each tensor, each in its own heap buffer.
  const uint8_t* next = data + kHeader;
  size_t left = size - kHeader;
  std::vector<std::vector<std::byte>> buffers;
  for (int i = 0; i < 3; ++i) {
    const size_t length = std::min<size_t>(u16(data + 16 + 2 * i), left);
    buffers.emplace_back(reinterpret_cast<const std::byte*>(next),
                         reinterpret_cast<const std::byte*>(next + length));
    next += length;
    left -= length;
  }
  w.packed.bytes = buffers[0];
  w.scale.bytes = buffers[1];
  w.shape.bytes = buffers[2];
  std::vector<float> values(static_cast<size_t>(rows * cols));
  try {
    tandem::experts::dequantisePackedInt4(w, rows, cols, values.data());
  } catch (const tandem::Error&) {
  }
  try {
    const uint64_t table_bytes = tandem::experts::blockTableBytes(tandem::experts::WeightType::INT4,
                                                                  tandem::experts::packedInt4Spec(),
                                                                  rows, cols - cols % 32, "fuzz");
    std::vector<unsigned char> table(table_bytes);
    tandem::experts::repackPackedInt4(w, rows, cols, table.data());
  } catch (const tandem::Error&) {
  }
  return 0;
}
