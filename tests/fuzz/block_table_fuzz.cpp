// libFuzzer target for the block-table checks of the expert engine (issue 27): a table's size
// against its tensor's shape (checkBlockTable) and the reference decoder over what it accepts.
//
// Input: 1 byte type, 1 byte int4 options, 2 bytes rows, 2 bytes cols, 4 bytes the table size
// the "file" claims, then the table itself. Only tandem::Error may escape; a table the check
// accepts is decoded row by row from a buffer of exactly the claimed size, so any read past it is
// an AddressSanitizer finding, and every decoded value of a finite-scaled block must be a number
// the decoder could have produced (not a read of uninitialised memory, which MSan-free builds
// catch as non-determinism across two decodes).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/core/error.h"
#include "engine/experts/expert_blocks.h"
#include "engine/experts/kernels/expert_kernels.h"

namespace {

using tandem::experts::WeightType;

constexpr WeightType kTypes[] = {WeightType::Q8_0,    WeightType::Q4_0, WeightType::Q4_K,
                                 WeightType::Q5_K,    WeightType::Q6_K, WeightType::IQ4_XS,
                                 WeightType::MXFP4,   WeightType::INT4, WeightType::BF16,
                                 WeightType::FP8_E4M3};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 10) return 0;
  const WeightType type = kTypes[data[0] % (sizeof(kTypes) / sizeof(kTypes[0]))];
  tandem::experts::Int4Spec int4;
  int4.group = 16 << (data[1] & 7);  // 16 .. 2048 (1: 32, 2: 64): the invalid ones are refused
  int4.symmetric = (data[1] & 8) == 0;
  const int64_t rows = data[2] | (data[3] << 8);
  const int64_t cols = data[4] | (data[5] << 8);
  uint32_t claimed;
  std::memcpy(&claimed, data + 6, 4);
  const uint8_t* table = data + 10;
  const size_t available = size - 10;
  if (rows * cols > (int64_t{1} << 18)) return 0;  // keeps each run fast
  try {
    tandem::experts::checkBlockTable(type, int4, rows, cols, claimed, "fuzz");
  } catch (const tandem::Error&) {
    return 0;
  }
  if (!tandem::experts::isBlockType(type)) return 0;
  if (claimed > available) return 0;  // a file whose tensor would lie past its end (parseGguf's)
  // Exactly the claimed bytes, on the heap, so a read past them is a finding.
  std::vector<uint8_t> exact(table, table + claimed);
  const tandem::experts::BlockLayout layout = tandem::experts::blockLayout(type, int4);
  const int64_t blocks_per_row = cols / layout.elems;
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    tandem::experts::kernels::ref::dequantBlocks(
        type, int4, exact.data() + r * blocks_per_row * layout.bytes, blocks_per_row, row.data());
  }
  return 0;
}
