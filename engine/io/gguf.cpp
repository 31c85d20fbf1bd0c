// GgufFile (mmap + parseGguf + typed getters), the GgufValue factories and writeGguf. Validation of
// what is read lives in gguf_header.cpp, the block formats in gguf_quant.cpp.

#include "engine/io/gguf.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "engine/core/error.h"
#include "engine/io/atomic_file.h"
#include "engine/io/gguf_detail.h"

namespace tandem::io {

namespace fs = std::filesystem;
using gguf_detail::isFloatType;
using gguf_detail::isIntegerType;

namespace {

constexpr uint32_t kVersionWritten = 3;
constexpr const char* kMissingKeyAdvice =
    "check that this is the model file you meant; `gguf_tool dump` lists the keys it holds";
constexpr const char* kWrongTypeAdvice =
    "the file does not follow llama.cpp's metadata conventions; re-convert it with a current "
    "llama.cpp";

std::string quotedName(std::string_view name) { return "\"" + std::string(name) + "\""; }

std::string describeType(const GgufValue& value) {
  if (value.type != GgufValueType::Array) return std::string(ggufValueTypeName(value.type));
  return "array of " + std::string(ggufValueTypeName(value.element_type));
}

// ---- writing --------------------------------------------------------------------------------

template <typename T>
void append(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void appendString(std::string& out, std::string_view text) {
  append<uint64_t>(out, text.size());
  out.append(text);
}

uint64_t padTo(uint64_t bytes, uint64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// Encodes values exactly as parseGguf reads them, refusing anything it would refuse.
class ValueEncoder {
 public:
  ValueEncoder(std::string& out, std::string where) : out_(out), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(where_ + ": " + what, "fix the metadata passed to writeGguf");
  }

  void integer(GgufValueType type, int64_t v) {
    const auto in = [&](int64_t lo, int64_t hi) {
      if (v < lo || v > hi) {
        fail(std::string(ggufValueTypeName(type)) + " value " + std::to_string(v) +
             " is out of range");
      }
    };
    switch (type) {
      case GgufValueType::UInt8:
        in(0, 255);
        append<uint8_t>(out_, static_cast<uint8_t>(v));
        return;
      case GgufValueType::Int8:
        in(-128, 127);
        append<int8_t>(out_, static_cast<int8_t>(v));
        return;
      case GgufValueType::UInt16:
        in(0, 65535);
        append<uint16_t>(out_, static_cast<uint16_t>(v));
        return;
      case GgufValueType::Int16:
        in(-32768, 32767);
        append<int16_t>(out_, static_cast<int16_t>(v));
        return;
      case GgufValueType::UInt32:
        in(0, 4294967295);
        append<uint32_t>(out_, static_cast<uint32_t>(v));
        return;
      case GgufValueType::Int32:
        in(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
        append<int32_t>(out_, static_cast<int32_t>(v));
        return;
      case GgufValueType::UInt64:
        in(0, std::numeric_limits<int64_t>::max());
        append<uint64_t>(out_, static_cast<uint64_t>(v));
        return;
      case GgufValueType::Int64: append<int64_t>(out_, v); return;
      default: break;
    }
    fail("internal: not an integer type");
  }

  void floating(GgufValueType type, double v) {
    if (type == GgufValueType::Float64) {
      append<double>(out_, v);
      return;
    }
    if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max()) {
      fail("float32 value " + std::to_string(v) + " is outside the float32 range");
    }
    append<float>(out_, static_cast<float>(v));
  }

  void scalar(const GgufValue& value) {
    if (isIntegerType(value.type)) {
      integer(value.type, expect<int64_t>(value));
    } else if (isFloatType(value.type)) {
      floating(value.type, expect<double>(value));
    } else if (value.type == GgufValueType::Bool) {
      append<uint8_t>(out_, expect<bool>(value) ? 1 : 0);
    } else if (value.type == GgufValueType::String) {
      appendString(out_, expect<std::string>(value));
    } else {
      fail("value type " + std::to_string(static_cast<uint32_t>(value.type)) +
           " is not a GGUF type");
    }
  }

  void array(const GgufValue& value) {
    const GgufValueType element = value.element_type;
    append<uint32_t>(out_, static_cast<uint32_t>(element));
    if (isIntegerType(element)) {
      items(expect<std::vector<int64_t>>(value), [&](int64_t v) { integer(element, v); });
    } else if (isFloatType(element)) {
      items(expect<std::vector<double>>(value), [&](double v) { floating(element, v); });
    } else if (element == GgufValueType::Bool) {
      items(expect<std::vector<bool>>(value), [&](bool v) { append<uint8_t>(out_, v ? 1 : 0); });
    } else if (element == GgufValueType::String) {
      items(expect<std::vector<std::string>>(value),
            [&](const std::string& v) { appendString(out_, v); });
    } else {
      fail("arrays of " +
           std::string(element == GgufValueType::Array ? "arrays" : "unknown types") +
           " cannot be written (GGUF readers refuse them)");
    }
  }

  void value(const GgufValue& v) {
    append<uint32_t>(out_, static_cast<uint32_t>(v.type));
    if (v.type == GgufValueType::Array) {
      array(v);
    } else {
      scalar(v);
    }
  }

 private:
  // The variant must hold what `type` says; a mismatch is a caller's bug that would otherwise
  // write a file that reads back as something else.
  template <typename T>
  const T& expect(const GgufValue& value) const {
    const T* held = std::get_if<T>(&value.value);
    if (held == nullptr)
      fail("declared " + describeType(value) + " but holds another kind of value");
    return *held;
  }

  template <typename Items, typename WriteOne>
  void items(const Items& values, WriteOne write_one) {
    append<uint64_t>(out_, values.size());
    for (const auto& v : values) write_one(v);
  }

  std::string& out_;
  std::string where_;
};

void checkName(const std::string& label, std::string_view kind, const std::string& name,
               std::set<std::string, std::less<>>& seen) {
  const char* problem = nullptr;
  if (name.empty()) {
    problem = "is empty";
  } else if (!gguf_detail::isValidUtf8(name)) {
    problem = "is not valid UTF-8";
  } else if (!seen.insert(name).second) {
    problem = "is used twice";
  }
  if (problem != nullptr) {
    throw Error(label + ": " + std::string(kind) + " " + quotedName(name) + " " + problem,
                "give every key and tensor a unique, non-empty UTF-8 name");
  }
}

// Metadata section: the given pairs in order, plus general.alignment when it is not the default and
// not already there. Returns the number of pairs written.
uint64_t encodeMetadata(std::string& out, const std::string& label,
                        const std::vector<std::pair<std::string, GgufValue>>& metadata,
                        uint64_t alignment) {
  std::set<std::string, std::less<>> keys;
  bool has_alignment_key = false;
  for (const auto& [key, value] : metadata) {
    checkName(label, "key", key, keys);
    if (key == gguf_detail::kAlignmentKey) {
      const int64_t* held = std::get_if<int64_t>(&value.value);
      if (value.type != GgufValueType::UInt32 || held == nullptr ||
          static_cast<uint64_t>(*held) != alignment) {
        throw Error(label + ": key " + quotedName(key) +
                        " must be a uint32 equal to the alignment argument (" +
                        std::to_string(alignment) + ")",
                    "pass the alignment as the argument and leave general.alignment out, or make "
                    "them agree");
      }
      has_alignment_key = true;
    }
    appendString(out, key);
    ValueEncoder(out, label + ": key " + quotedName(key)).value(value);
  }
  if (has_alignment_key || alignment == gguf_detail::kDefaultAlignment) return metadata.size();
  appendString(out, gguf_detail::kAlignmentKey);
  ValueEncoder(out, label).value(GgufValue::ofUInt32(static_cast<uint32_t>(alignment)));
  return metadata.size() + 1;
}

uint64_t checkedTensorBytes(const std::string& label, const GgufTensorToWrite& tensor) {
  const std::string where = label + ": tensor " + quotedName(tensor.name);
  const std::optional<GgmlTypeTraits> traits = ggmlTypeTraits(static_cast<uint32_t>(tensor.type));
  if (!traits)
    throw Error(where + ": unknown ggml type " +
                std::to_string(static_cast<uint32_t>(tensor.type)));
  if (tensor.ne.empty() || tensor.ne.size() > gguf_detail::kMaxDims) {
    throw Error(where + ": has " + std::to_string(tensor.ne.size()) +
                " dimensions; ggml tensors have 1 to 4");
  }
  int64_t numel = 1;
  for (int64_t dim : tensor.ne) {
    if (dim < 1 || __builtin_mul_overflow(numel, dim, &numel)) {
      throw Error(where + ": shape has a dimension below 1 or more than 2^63 elements");
    }
  }
  if (tensor.ne[0] % traits->block_elems != 0) {
    throw Error(where + ": ne[0] = " + std::to_string(tensor.ne[0]) + " is not a multiple of the " +
                std::string(traits->name) + " block size " + std::to_string(traits->block_elems));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel / traits->block_elems),
                             static_cast<uint64_t>(traits->block_bytes), &bytes) ||
      bytes != tensor.bytes.size()) {
    throw Error(where + ": has " + std::to_string(tensor.bytes.size()) +
                " bytes but its shape and type " + std::string(traits->name) + " need " +
                std::to_string(bytes));
  }
  return bytes;
}

void writeZeros(std::FILE* out, uint64_t count) {
  static constexpr std::array<char, 4096> kZeros{};
  while (count > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(count, kZeros.size()));
    std::fwrite(kZeros.data(), 1, chunk, out);
    count -= chunk;
  }
}

}  // namespace

// ---- GgufValue ------------------------------------------------------------------------------

GgufValue GgufValue::ofString(std::string s) {
  return {GgufValueType::String, GgufValueType::UInt32, std::move(s)};
}
GgufValue GgufValue::ofUInt32(uint32_t v) {
  return {GgufValueType::UInt32, GgufValueType::UInt32, int64_t{v}};
}
GgufValue GgufValue::ofInt64(int64_t v, GgufValueType type) {
  return {type, GgufValueType::UInt32, v};
}
GgufValue GgufValue::ofFloat32(float v) {
  return {GgufValueType::Float32, GgufValueType::UInt32, double{v}};
}
GgufValue GgufValue::ofBool(bool v) { return {GgufValueType::Bool, GgufValueType::UInt32, v}; }
GgufValue GgufValue::ofStrings(std::vector<std::string> v) {
  return {GgufValueType::Array, GgufValueType::String, std::move(v)};
}
GgufValue GgufValue::ofInts(std::vector<int64_t> v, GgufValueType element_type) {
  return {GgufValueType::Array, element_type, std::move(v)};
}
GgufValue GgufValue::ofFloats(std::vector<double> v, GgufValueType element_type) {
  return {GgufValueType::Array, element_type, std::move(v)};
}

// ---- GgufFile -------------------------------------------------------------------------------

GgufFile GgufFile::open(const fs::path& path) {
  GgufFile file;
  file.path_ = path;
  file.map_ = MappedFile::open(path);
  file.header_ = parseGguf(file.map_.bytes(), path.string());
  for (size_t i = 0; i < file.header_.metadata.size(); ++i)
    file.key_index_.emplace(file.header_.metadata[i].first, i);
  for (size_t i = 0; i < file.header_.tensors.size(); ++i)
    file.tensor_index_.emplace(file.header_.tensors[i].name, i);
  return file;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &header_.metadata[it->second].second;
}

namespace {

const GgufValue& require(const GgufFile& file, std::string_view key) {
  const GgufValue* value = file.find(key);
  if (value == nullptr) {
    throw Error(file.path().string() + ": metadata key " + quotedName(key) + " is missing",
                kMissingKeyAdvice);
  }
  return *value;
}

[[noreturn]] void wrongType(const GgufFile& file, std::string_view key, const GgufValue& value,
                            std::string_view expected) {
  throw Error(file.path().string() + ": metadata key " + quotedName(key) + " is " +
                  describeType(value) + ", not " + std::string(expected),
              kWrongTypeAdvice);
}

}  // namespace

std::string GgufFile::getString(std::string_view key) const {
  const GgufValue& value = require(*this, key);
  if (value.type != GgufValueType::String) wrongType(*this, key, value, "a string");
  return std::get<std::string>(value.value);
}

int64_t GgufFile::getInt(std::string_view key) const {
  const GgufValue& value = require(*this, key);
  if (!isIntegerType(value.type)) wrongType(*this, key, value, "an integer");
  return std::get<int64_t>(value.value);
}

double GgufFile::getFloat(std::string_view key) const {
  const GgufValue& value = require(*this, key);
  if (isFloatType(value.type)) return std::get<double>(value.value);
  if (isIntegerType(value.type)) return static_cast<double>(std::get<int64_t>(value.value));
  wrongType(*this, key, value, "a number");
}

bool GgufFile::getBool(std::string_view key) const {
  const GgufValue& value = require(*this, key);
  if (value.type != GgufValueType::Bool) wrongType(*this, key, value, "a bool");
  return std::get<bool>(value.value);
}

std::optional<std::string> GgufFile::optString(std::string_view key) const {
  return find(key) ? std::optional<std::string>(getString(key)) : std::nullopt;
}
std::optional<int64_t> GgufFile::optInt(std::string_view key) const {
  return find(key) ? std::optional<int64_t>(getInt(key)) : std::nullopt;
}
std::optional<double> GgufFile::optFloat(std::string_view key) const {
  return find(key) ? std::optional<double>(getFloat(key)) : std::nullopt;
}
std::optional<bool> GgufFile::optBool(std::string_view key) const {
  return find(key) ? std::optional<bool>(getBool(key)) : std::nullopt;
}

const std::vector<std::string>& GgufFile::getStrings(std::string_view key) const {
  const GgufValue& value = require(*this, key);
  if (value.type != GgufValueType::Array || value.element_type != GgufValueType::String) {
    wrongType(*this, key, value, "an array of strings");
  }
  return std::get<std::vector<std::string>>(value.value);
}

const std::vector<int64_t>& GgufFile::getInts(std::string_view key) const {
  const GgufValue& value = require(*this, key);
  if (value.type != GgufValueType::Array || !isIntegerType(value.element_type)) {
    wrongType(*this, key, value, "an array of integers");
  }
  return std::get<std::vector<int64_t>>(value.value);
}

const std::vector<double>& GgufFile::getFloats(std::string_view key) const {
  const GgufValue& value = require(*this, key);
  if (value.type != GgufValueType::Array || !isFloatType(value.element_type)) {
    wrongType(*this, key, value, "an array of floats");
  }
  return std::get<std::vector<double>>(value.value);
}

const GgufTensorInfo* GgufFile::findTensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const std::byte> GgufFile::tensorBytes(const GgufTensorInfo& tensor) const {
  // parseGguf checked this file's tensors; this guards against an info from another file.
  const uint64_t data_bytes =
      header_.data_offset <= map_.size() ? map_.size() - header_.data_offset : 0;
  if (tensor.offset > data_bytes || tensor.byte_size > data_bytes - tensor.offset) {
    throw Error(path_.string() + ": tensor " + quotedName(tensor.name) + " is not inside this file",
                "look tensors up with findTensor() on the file they came from");
  }
  return {map_.data() + header_.data_offset + tensor.offset, static_cast<size_t>(tensor.byte_size)};
}

std::vector<float> GgufFile::dequantize(const GgufTensorInfo& tensor) const {
  const std::span<const std::byte> bytes = tensorBytes(tensor);
  std::vector<float> out(static_cast<size_t>(tensor.numel()));
  dequantizeGgml(tensor.type, bytes, tensor.numel(), out.data(),
                 path_.string() + ": tensor " + quotedName(tensor.name));
  return out;
}

// ---- writeGguf ------------------------------------------------------------------------------

void writeGguf(const fs::path& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
               std::span<const GgufTensorToWrite> tensors, uint64_t alignment) {
  const std::string label = "cannot write " + path.string();
  if (!std::has_single_bit(alignment) || alignment > std::numeric_limits<uint32_t>::max()) {
    throw Error(
        label + ": alignment " + std::to_string(alignment) + " is not a power of two below 2^32",
        "use the default 32 or another power of two");
  }
  std::string kv_bytes;
  const uint64_t kv_count = encodeMetadata(kv_bytes, label, metadata, alignment);

  std::string header;
  header.append("GGUF");
  append<uint32_t>(header, kVersionWritten);
  append<uint64_t>(header, tensors.size());
  append<uint64_t>(header, kv_count);
  header += kv_bytes;

  // Offsets as GGUFWriter and llama.cpp lay them out: each tensor padded to the alignment.
  std::set<std::string, std::less<>> names;
  std::vector<uint64_t> padded_bytes;
  uint64_t offset = 0;
  for (const GgufTensorToWrite& tensor : tensors) {
    checkName(label, "tensor", tensor.name, names);
    const uint64_t bytes = checkedTensorBytes(label, tensor);
    appendString(header, tensor.name);
    append<uint32_t>(header, static_cast<uint32_t>(tensor.ne.size()));
    for (int64_t dim : tensor.ne) append<uint64_t>(header, static_cast<uint64_t>(dim));
    append<uint32_t>(header, static_cast<uint32_t>(tensor.type));
    append<uint64_t>(header, offset);
    padded_bytes.push_back(padTo(bytes, alignment));
    offset += padded_bytes.back();
  }
  header.append(padTo(header.size(), alignment) - header.size(), '\0');

  writeFileAtomically(path, [&](std::FILE* out) {
    std::fwrite(header.data(), 1, header.size(), out);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::span<const std::byte> bytes = tensors[i].bytes;
      std::fwrite(bytes.data(), 1, bytes.size(), out);
      writeZeros(out, padded_bytes[i] - bytes.size());
    }
  });
}

}  // namespace tandem::io
