// parseSafetensorsHeader: every claim of an untrusted safetensors header is checked here, before
// any offset is used to touch memory. Pure function of its inputs (the libFuzzer target).
//
// Rules (those of the reference Rust implementation, which the Python package uses):
//  - the header is valid UTF-8 holding one JSON object; trailing whitespace is allowed (the
//    reference writer pads the header with spaces to an 8-byte boundary);
//  - "__metadata__", if present, is an object of string -> string;
//  - every other key is a non-empty tensor name whose value is an object with exactly "dtype"
//    (a known name), "shape" (non-negative integers) and "data_offsets" ([begin, end] integers);
//  - numel * dtype size == end - begin, computed with overflow checks;
//  - sorted by offset, the tensors tile the data section exactly: no overlap, no gap, and the last
//    one ends at the end of the data section (the reference rejects anything else with
//    "MetadataIncompleteBuffer"/"InvalidOffset"; every file it writes satisfies this).
//  - duplicate keys in the JSON object are rejected (plain JSON parsers silently keep one of
//    them, which would let two readers see different tensors in the same file).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "engine/core/error.h"
#include "engine/io/safetensors.h"

namespace tandem::io {

namespace {

using nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr int kMaxContainerDepth = 3;
constexpr const char* kCorruptAdvice =
    "the file is corrupt or not a safetensors file; re-download or re-export it";

[[noreturn]] void fail(const std::string& label, const std::string& what) {
  throw Error(label + ": " + what, kCorruptAdvice);
}

[[noreturn]] void failTensor(const std::string& label, const std::string& name,
                             const std::string& what) {
  throw Error(label + ": tensor \"" + name + "\": " + what, kCorruptAdvice);
}

// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
// Returns the offset of the first bad byte, or npos.
size_t findInvalidUtf8(std::span<const std::byte> bytes) {
  const size_t n = bytes.size();
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<uint8_t>(bytes[k]); };
  auto is_cont = [&](size_t k) { return k < n && (at(k) & 0xC0) == 0x80; };
  while (i < n) {
    const uint8_t c = at(i);
    if (c < 0x80) {
      ++i;
    } else if (c >= 0xC2 && c <= 0xDF) {
      if (!is_cont(i + 1)) return i;
      i += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      if (!is_cont(i + 1) || !is_cont(i + 2)) return i;
      const uint8_t c1 = at(i + 1);
      if (c == 0xE0 && c1 < 0xA0) return i;   // overlong
      if (c == 0xED && c1 >= 0xA0) return i;  // UTF-16 surrogate
      i += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (!is_cont(i + 1) || !is_cont(i + 2) || !is_cont(i + 3)) return i;
      const uint8_t c1 = at(i + 1);
      if (c == 0xF0 && c1 < 0x90) return i;   // overlong
      if (c == 0xF4 && c1 >= 0x90) return i;  // above U+10FFFF
      i += 4;
    } else {
      return i;
    }
  }
  return std::string_view::npos;
}

json parseJson(std::span<const std::byte> header_json, const std::string& label) {
  if (size_t bad = findInvalidUtf8(header_json); bad != std::string_view::npos) {
    fail(label,
         "header is not valid UTF-8 (bad byte at header offset " + std::to_string(bad) + ")");
  }
  const char* first = reinterpret_cast<const char*>(header_json.data());
  const char* last = first + header_json.size();

  // Track keys of the top-level object to reject duplicates (depth 1 = keys of the root).
  std::set<std::string> top_level_keys;
  std::string duplicate;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    // A valid header nests at most root -> entry -> shape array (containers start at depth 0..2).
    // Stopping deeper nesting early keeps a hostile 100 MB "[[[[..." from costing gigabytes.
    const bool container_start =
        event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    if (container_start && depth >= kMaxContainerDepth) {
      fail(label, "header JSON is nested too deeply for a safetensors header");
    }
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!top_level_keys.insert(key).second) duplicate = key;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(first, last, on_event, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    fail(label, std::string("header is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) {
    fail(label, std::string("header is not a JSON object (it is a JSON ") + root.type_name() + ")");
  }
  if (!duplicate.empty()) fail(label, "header lists \"" + duplicate + "\" twice");
  return root;
}

std::map<std::string, std::string> parseMetadata(const json& value, const std::string& label) {
  if (!value.is_object()) {
    fail(label, std::string("\"__metadata__\" must be an object of strings, not a JSON ") +
                    value.type_name());
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      fail(label, "\"__metadata__\" value for key \"" + key + "\" is a JSON " + item.type_name() +
                      ", not a string");
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

// A JSON integer that is >= 0 and fits in int64 (nlohmann keeps non-negative literals unsigned).
std::optional<uint64_t> nonNegativeInteger(const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return v;
    return std::nullopt;
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

std::vector<int64_t> parseShape(const json& value, const std::string& label,
                                const std::string& name) {
  if (!value.is_array()) {
    failTensor(label, name,
               std::string("\"shape\" must be an array of non-negative integers, not a JSON ") +
                   value.type_name());
  }
  std::vector<int64_t> shape;
  shape.reserve(value.size());
  for (const json& dim : value) {
    const std::optional<uint64_t> size = nonNegativeInteger(dim);
    if (!size) {
      const bool negative = dim.is_number_integer() && !dim.is_number_unsigned();
      failTensor(
          label, name,
          negative ? "\"shape\" has a negative dimension"
                   : std::string("\"shape\" entries must be non-negative integers (found a JSON ") +
                         dim.type_name() + ")");
    }
    shape.push_back(static_cast<int64_t>(*size));
  }
  return shape;
}

// numel * element size in bytes; overflow is an error, not a wrap-around. Each partial product
// must fit in int64 so that TensorInfo::numel() cannot overflow later.
uint64_t shapeBytes(const std::vector<int64_t>& shape, DType dtype, const std::string& label,
                    const std::string& name) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (__builtin_mul_overflow(numel, dim, &numel)) {
      failTensor(label, name, "the number of elements in \"shape\" overflows 64 bits");
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(dtypeSize(dtype)),
                             &bytes)) {
    failTensor(label, name, "the byte size of \"shape\" overflows 64 bits");
  }
  return bytes;
}

TensorInfo parseTensor(const std::string& name, const json& value, uint64_t data_section_bytes,
                       const std::string& label) {
  if (name.empty()) fail(label, "header has an empty tensor name");
  if (!value.is_object()) {
    failTensor(label, name,
               std::string("entry must be an object, not a JSON ") + value.type_name());
  }
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      failTensor(label, name,
                 "unexpected field \"" + key + "\" (allowed: dtype, shape, data_offsets)");
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) failTensor(label, name, std::string("missing field \"") + key + "\"");
  }

  TensorInfo info;
  info.name = name;
  const json& dtype = value["dtype"];
  if (!dtype.is_string()) {
    failTensor(label, name,
               std::string("\"dtype\" must be a string, not a JSON ") + dtype.type_name());
  }
  const std::string& dtype_name = dtype.get_ref<const std::string&>();
  const std::optional<DType> parsed_dtype = parseDType(dtype_name);
  if (!parsed_dtype) failTensor(label, name, "unknown dtype \"" + dtype_name + "\"");
  info.dtype = *parsed_dtype;
  info.shape = parseShape(value["shape"], label, name);

  const json& offsets = value["data_offsets"];
  std::optional<uint64_t> begin, end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = nonNegativeInteger(offsets[0]);
    end = nonNegativeInteger(offsets[1]);
  }
  if (!begin || !end) {
    failTensor(label, name,
               "\"data_offsets\" must be an array of two non-negative integers [begin, end]");
  }
  if (*end < *begin) {
    failTensor(label, name,
               "\"data_offsets\" end " + std::to_string(*end) + " is before begin " +
                   std::to_string(*begin));
  }
  info.begin = *begin;
  info.end = *end;

  const uint64_t expected_bytes = shapeBytes(info.shape, info.dtype, label, name);
  if (expected_bytes != info.byteSize()) {
    failTensor(label, name,
               "shape and dtype need " + std::to_string(expected_bytes) +
                   " bytes but data_offsets span " + std::to_string(info.byteSize()) +
                   " bytes (size does not match)");
  }
  if (info.end > data_section_bytes) {
    failTensor(label, name,
               "data_offsets end " + std::to_string(info.end) +
                   " is past the end of the data section (" + std::to_string(data_section_bytes) +
                   " bytes); the file may be truncated");
  }
  return info;
}

// Sorted by offset, tensors must tile [0, data_section_bytes) exactly.
void checkTiling(const std::vector<TensorInfo>& sorted, uint64_t data_section_bytes,
                 const std::string& label) {
  uint64_t position = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& info : sorted) {
    if (info.begin < position) {
      failTensor(label, info.name,
                 "bytes [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                     ") overlap tensor \"" + (previous ? previous->name : std::string()) + "\"");
    }
    if (info.begin > position) {
      failTensor(label, info.name,
                 "there is a gap of " + std::to_string(info.begin - position) +
                     " unused bytes before this tensor in the data section");
    }
    position = info.end;
    previous = &info;
  }
  if (position != data_section_bytes) {
    fail(label, "the data section has " + std::to_string(data_section_bytes - position) +
                    " trailing bytes not covered by any tensor (gap at the end)");
  }
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;  // validated by parseSafetensorsHeader not to overflow
  return n;
}

SafetensorsHeader parseSafetensorsHeader(std::span<const std::byte> header_json,
                                         uint64_t data_section_bytes, const std::string& label) {
  const json root = parseJson(header_json, label);
  SafetensorsHeader header;
  header.tensors.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      header.metadata = parseMetadata(value, label);
    } else {
      header.tensors.push_back(parseTensor(key, value, data_section_bytes, label));
    }
  }
  // Zero-size tensors sort before a non-empty tensor at the same offset, so they tile too.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              if (a.begin != b.begin) return a.begin < b.begin;
              if (a.end != b.end) return a.end < b.end;
              return a.name < b.name;
            });
  checkTiling(header.tensors, data_section_bytes, label);
  return header;
}

}  // namespace tandem::io
