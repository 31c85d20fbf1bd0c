// libFuzzer target for parseSafetensorsHeader.
//
// Input layout mirrors a file: [u64 little-endian header length][header bytes][data section]. The
// header is clamped to what the input holds, and whatever follows it is the data section, exactly
// as SafetensorsFile::open splits a file. Only tandem::Error may escape the parser; any other
// exception, crash, sanitizer finding or leak is a bug that the fuzzer reports.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "engine/core/error.h"
#include "engine/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t claimed_header_bytes = 0;
  for (int i = 7; i >= 0; --i) claimed_header_bytes = (claimed_header_bytes << 8) | data[i];
  const uint64_t available = size - 8;
  const uint64_t header_bytes = claimed_header_bytes < available ? claimed_header_bytes : available;
  const std::span<const std::byte> header(reinterpret_cast<const std::byte*>(data) + 8,
                                          static_cast<size_t>(header_bytes));
  const uint64_t data_section_bytes = available - header_bytes;
  try {
    const tandem::io::SafetensorsHeader parsed =
        tandem::io::parseSafetensorsHeader(header, data_section_bytes, "fuzz-input");
    // Invariants a successful parse promises to its callers.
    uint64_t position = 0;
    for (const tandem::io::TensorInfo& info : parsed.tensors) {
      if (info.begin != position || info.end < info.begin || info.end > data_section_bytes ||
          static_cast<uint64_t>(info.numel()) * tandem::io::dtypeSize(info.dtype) !=
              info.byteSize()) {
        __builtin_trap();
      }
      position = info.end;
    }
    if (position != data_section_bytes) __builtin_trap();
  } catch (const tandem::Error&) {
    // Rejected input: the expected outcome for most inputs.
  }
  return 0;
}
