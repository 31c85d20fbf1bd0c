// libFuzzer target for parseGguf, and for dequantizeGgml over what it accepts.
//
// The input is a whole file. Only tandem::Error may escape the parser; any other exception, crash,
// sanitizer finding or leak is a bug that the fuzzer reports. A successful parse must keep its
// promises: every tensor aligned, inside the input and disjoint from the others, with a byte size
// that matches its shape; and dequantizing such a tensor must neither fail nor read outside it.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/error.h"
#include "engine/io/gguf.h"

namespace {

// Keeps each run fast; larger tensors exercise no code path that small ones do not.
constexpr int64_t kMaxDequantElems = int64_t{1} << 16;

void checkPromises(const tandem::io::GgufHeader& header, std::span<const std::byte> file) {
  if (!std::has_single_bit(header.alignment) || header.data_offset % header.alignment != 0)
    __builtin_trap();
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const tandem::io::GgufTensorInfo& info : header.tensors) {
    const std::optional<tandem::io::GgmlTypeTraits> traits =
        tandem::io::ggmlTypeTraits(static_cast<uint32_t>(info.type));
    if (!traits || info.ne.empty() || info.ne.size() > 4 || info.offset % header.alignment != 0)
      __builtin_trap();
    const int64_t numel = info.numel();
    if (numel < 1 || numel % traits->block_elems != 0 ||
        static_cast<uint64_t>(numel / traits->block_elems) *
                static_cast<uint64_t>(traits->block_bytes) !=
            info.byte_size) {
      __builtin_trap();
    }
    const uint64_t begin = header.data_offset + info.offset;
    if (begin > file.size() || info.byte_size > file.size() - begin) __builtin_trap();
    ranges.emplace_back(begin, begin + info.byte_size);
    if (traits->dequantizable && numel <= kMaxDequantElems) {
      std::vector<float> out(static_cast<size_t>(numel));
      // Throws only on a broken promise above, which the fuzzer then reports as a crash.
      tandem::io::dequantizeGgml(
          info.type, file.subspan(static_cast<size_t>(begin), static_cast<size_t>(info.byte_size)),
          numel, out.data(), info.name);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  tandem::io::GgufHeader header;
  try {
    header = tandem::io::parseGguf(file, "fuzz-input");
  } catch (const tandem::Error&) {
    return 0;  // rejected input: the expected outcome for most inputs
  }
  try {
    checkPromises(header, file);
  } catch (const tandem::Error&) {
    __builtin_trap();
  }
  return 0;
}
