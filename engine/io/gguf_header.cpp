// parseGguf: every claim of an untrusted GGUF file is checked here, before any offset is used to
// touch memory, and before any count is used to allocate. Pure function of its input (the libFuzzer
// target). Also the ggml type table, which the parser needs for tensor sizes.
//
// Rules (llama.cpp's gguf.cpp and gguf-py's GGUFReader agree on the format; where they differ in
// strictness, the stricter reading is kept):
//  - magic "GGUF", version 2 or 3, little-endian; v1 and big-endian files are refused by name;
//  - every count and length is bounded by the bytes left in the file before anything is reserved;
//  - keys and tensor names are non-empty, valid UTF-8 and unique; string values are raw bytes;
//  - value types 0-12; arrays hold scalars or strings, never arrays; bools are 0 or 1; uint64
//    values must fit in int64 (GgufValue holds every integer as int64_t);
//  - general.alignment, if present, is a uint32 power of two;
//  - tensors have 1-4 dims, each >= 1 as int64, a product that fits in int64, a known ggml type,
//    ne[0] a multiple of the block size, an aligned offset, and bytes inside the file that overlap
//    no other tensor. Gaps between tensors are allowed (padding), and so is a missing pad after
//    the last tensor (llama.cpp's mmap loader only checks that each tensor is inside the file).

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <string>

#include "engine/core/error.h"
#include "engine/io/gguf.h"
#include "engine/io/gguf_detail.h"

namespace tandem::io {

static_assert(std::endian::native == std::endian::little,
              "GGUF fields are read with memcpy, which assumes a little-endian host");

namespace {

using gguf_detail::isFloatType;
using gguf_detail::isIntegerType;
using gguf_detail::isValidUtf8;
using gguf_detail::kAlignmentKey;
using gguf_detail::kMaxDims;

// Smallest possible encodings; a count larger than the bytes left divided by these is a lie.
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;  // empty key, value type, one byte
constexpr uint64_t kMinTensorInfoBytes =
    8 + 4 + 8 + 4 + 8;  // empty name, n_dims, 1 dim, type, offset
constexpr const char* kCorruptAdvice =
    "the file is corrupt, truncated or not a GGUF file; re-download it or re-convert it with "
    "llama.cpp";

[[noreturn]] void fail(const std::string& label, const std::string& what,
                       const std::string& advice = kCorruptAdvice) {
  throw Error(label + ": " + what, advice);
}

std::string quotedName(std::string_view name) { return "\"" + std::string(name) + "\""; }

// A bounds-checked little-endian cursor. `context_` names the key or tensor being read so that a
// truncation message says where the file ends, without building a string for every element.
class Reader {
 public:
  Reader(std::span<const std::byte> file, const std::string& label) : file_(file), label_(label) {}

  uint64_t position() const { return position_; }
  uint64_t remaining() const { return file_.size() - position_; }
  void setContext(std::string context) { context_ = std::move(context); }

  [[noreturn]] void failHere(const std::string& what) const {
    fail(label_, context_.empty() ? what : context_ + ": " + what);
  }

  std::span<const std::byte> take(uint64_t bytes, std::string_view what) {
    if (bytes > remaining()) {
      failHere("the file ends inside " + std::string(what) + " (needs " + std::to_string(bytes) +
               " bytes at offset " + std::to_string(position_) + ", " +
               std::to_string(remaining()) + " left); it is truncated");
    }
    const std::span<const std::byte> out =
        file_.subspan(static_cast<size_t>(position_), static_cast<size_t>(bytes));
    position_ += bytes;
    return out;
  }

  template <typename T>
  T scalar(std::string_view what) {
    T value;
    std::memcpy(&value, take(sizeof(T), what).data(), sizeof(T));
    return value;
  }

  std::string string(std::string_view what) {
    const uint64_t length = scalar<uint64_t>(what);
    if (length > remaining()) {
      failHere(std::string(what) + " claims " + std::to_string(length) +
               " bytes, past the end of the file (" + std::to_string(remaining()) + " bytes left)");
    }
    const std::span<const std::byte> bytes = take(length, what);
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

  // A count of items of at least `min_item_bytes` each, checked against the bytes left.
  uint64_t count(std::string_view what, uint64_t min_item_bytes) {
    const uint64_t n = scalar<uint64_t>(what);
    if (n > remaining() / min_item_bytes) {
      failHere(std::string(what) + " " + std::to_string(n) + " cannot fit in the " +
               std::to_string(remaining()) + " bytes left in the file (each needs at least " +
               std::to_string(min_item_bytes) + ")");
    }
    return n;
  }

 private:
  std::span<const std::byte> file_;
  const std::string& label_;
  uint64_t position_ = 0;
  std::string context_;
};

// Bytes of one value in the file; strings count their length prefix only.
uint64_t minEncodedBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::UInt8:
    case GgufValueType::Int8:
    case GgufValueType::Bool: return 1;
    case GgufValueType::UInt16:
    case GgufValueType::Int16: return 2;
    case GgufValueType::UInt32:
    case GgufValueType::Int32:
    case GgufValueType::Float32: return 4;
    case GgufValueType::UInt64:
    case GgufValueType::Int64:
    case GgufValueType::Float64: return 8;
    case GgufValueType::String: return 8;
    case GgufValueType::Array: return 4 + 8;
  }
  return 1;
}

GgufValueType readValueType(Reader& in, std::string_view what) {
  const uint32_t raw = in.scalar<uint32_t>(what);
  if (raw > static_cast<uint32_t>(GgufValueType::Float64)) {
    in.failHere("unknown " + std::string(what) + " " + std::to_string(raw) +
                " (GGUF defines 0-12)");
  }
  return static_cast<GgufValueType>(raw);
}

int64_t readInteger(Reader& in, GgufValueType type) {
  switch (type) {
    case GgufValueType::UInt8: return in.scalar<uint8_t>("a uint8 value");
    case GgufValueType::Int8: return in.scalar<int8_t>("an int8 value");
    case GgufValueType::UInt16: return in.scalar<uint16_t>("a uint16 value");
    case GgufValueType::Int16: return in.scalar<int16_t>("an int16 value");
    case GgufValueType::UInt32: return in.scalar<uint32_t>("a uint32 value");
    case GgufValueType::Int32: return in.scalar<int32_t>("an int32 value");
    case GgufValueType::Int64: return in.scalar<int64_t>("an int64 value");
    case GgufValueType::UInt64: {
      const uint64_t value = in.scalar<uint64_t>("a uint64 value");
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        in.failHere("uint64 value " + std::to_string(value) +
                    " is above 2^63-1, which this reader does not hold");
      }
      return static_cast<int64_t>(value);
    }
    default: break;
  }
  in.failHere("internal: not an integer type");
}

double readFloat(Reader& in, GgufValueType type) {
  if (type == GgufValueType::Float32) return in.scalar<float>("a float32 value");
  return in.scalar<double>("a float64 value");
}

bool readBool(Reader& in) {
  const uint8_t byte = in.scalar<uint8_t>("a bool value");
  if (byte > 1) in.failHere("bool value is " + std::to_string(byte) + ", not 0 or 1");
  return byte == 1;
}

template <typename T, typename ReadOne>
void readItems(GgufValue& value, uint64_t n, ReadOne read_one) {
  auto& items = value.value.emplace<std::vector<T>>();
  items.reserve(static_cast<size_t>(n));  // n was checked against the bytes left
  for (uint64_t i = 0; i < n; ++i) items.push_back(read_one());
}

GgufValue readArray(Reader& in) {
  GgufValue value;
  value.type = GgufValueType::Array;
  value.element_type = readValueType(in, "array element type");
  if (value.element_type == GgufValueType::Array) {
    in.failHere("is an array of arrays, which GGUF readers (llama.cpp, gguf-py) do not support");
  }
  const GgufValueType element = value.element_type;
  const uint64_t n = in.count("array length", minEncodedBytes(element));
  if (isIntegerType(element)) {
    readItems<int64_t>(value, n, [&] { return readInteger(in, element); });
  } else if (isFloatType(element)) {
    readItems<double>(value, n, [&] { return readFloat(in, element); });
  } else if (element == GgufValueType::Bool) {
    readItems<bool>(value, n, [&] { return readBool(in); });
  } else {
    readItems<std::string>(value, n, [&] { return in.string("an array string"); });
  }
  return value;
}

GgufValue readValue(Reader& in, GgufValueType type) {
  GgufValue value;
  value.type = type;
  if (isIntegerType(type)) {
    value.value = readInteger(in, type);
  } else if (isFloatType(type)) {
    value.value = readFloat(in, type);
  } else if (type == GgufValueType::Bool) {
    value.value = readBool(in);
  } else if (type == GgufValueType::String) {
    value.value = in.string("a string value");
  } else {
    value = readArray(in);
  }
  return value;
}

uint32_t readVersion(Reader& in, const std::string& label) {
  const uint32_t version = in.scalar<uint32_t>("the version");
  if (version == 2 || version == 3) return version;
  if (version == 1) {
    fail(label,
         "is a GGUF v1 file, an early format (32-bit counts) that this reader does not support",
         "re-convert the model with a current llama.cpp (convert_hf_to_gguf.py), which writes v3");
  }
  const uint32_t swapped = __builtin_bswap32(version);
  if ((version & 0xFFFFu) == 0 && swapped >= 1 && swapped <= 3) {
    fail(label, "is a big-endian GGUF file (version " + std::to_string(swapped) + " byte-swapped)",
         "convert it to little-endian with gguf-py's gguf_convert_endian.py, or re-convert the "
         "model");
  }
  fail(label,
       "has GGUF version " + std::to_string(version) + "; this reader supports versions 2 and 3",
       "re-convert the model with a llama.cpp release this reader knows, or update Tandem");
}

void readMetadata(Reader& in, uint64_t kv_count, GgufHeader& header) {
  std::set<std::string, std::less<>> keys;
  for (uint64_t i = 0; i < kv_count; ++i) {
    in.setContext("key/value #" + std::to_string(i));
    std::string key = in.string("the key");
    if (key.empty()) in.failHere("has an empty key");
    if (!isValidUtf8(key)) in.failHere("key is not valid UTF-8");
    in.setContext("key " + quotedName(key));
    if (!keys.insert(key).second) in.failHere("appears twice in the metadata");
    const GgufValueType type = readValueType(in, "value type");
    GgufValue value = readValue(in, type);
    if (key == kAlignmentKey) {
      if (type != GgufValueType::UInt32) {
        in.failHere("must be a uint32, not a " + std::string(ggufValueTypeName(type)));
      }
      const auto alignment = static_cast<uint64_t>(std::get<int64_t>(value.value));
      if (!std::has_single_bit(alignment)) {
        in.failHere("is " + std::to_string(alignment) + ", which is not a power of two");
      }
      header.alignment = alignment;
    }
    header.metadata.emplace_back(std::move(key), std::move(value));
  }
}

GgufTensorInfo readTensorInfo(Reader& in, uint64_t index) {
  in.setContext("tensor #" + std::to_string(index));
  GgufTensorInfo info;
  info.name = in.string("the tensor name");
  if (info.name.empty()) in.failHere("has an empty name");
  if (!isValidUtf8(info.name)) in.failHere("name is not valid UTF-8");
  in.setContext("tensor " + quotedName(info.name));

  const uint32_t n_dims = in.scalar<uint32_t>("n_dims");
  if (n_dims < 1 || n_dims > kMaxDims) {
    in.failHere("has " + std::to_string(n_dims) + " dimensions; ggml tensors have 1 to 4");
  }
  int64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const int64_t dim = in.scalar<int64_t>("the shape");
    if (dim < 1)
      in.failHere("ne[" + std::to_string(d) + "] is " + std::to_string(dim) +
                  "; every dimension must be >= 1");
    if (__builtin_mul_overflow(numel, dim, &numel)) {
      in.failHere("the number of elements overflows 64 bits");
    }
    info.ne.push_back(dim);
  }

  const uint32_t raw_type = in.scalar<uint32_t>("the ggml type");
  const std::optional<GgmlTypeTraits> traits = ggmlTypeTraits(raw_type);
  if (!traits) in.failHere("has unknown ggml type " + std::to_string(raw_type));
  info.type = static_cast<GgmlType>(raw_type);
  if (info.ne[0] % traits->block_elems != 0) {
    in.failHere("ne[0] = " + std::to_string(info.ne[0]) + " is not a multiple of the " +
                std::string(traits->name) + " block size " + std::to_string(traits->block_elems));
  }
  const auto blocks = static_cast<uint64_t>(numel / traits->block_elems);
  if (__builtin_mul_overflow(blocks, static_cast<uint64_t>(traits->block_bytes), &info.byte_size)) {
    in.failHere("the byte size overflows 64 bits");
  }
  info.offset = in.scalar<uint64_t>("the data offset");
  return info;
}

// Offsets aligned, every tensor inside the data section, no two overlapping.
void checkTensorPlacement(const GgufHeader& header, uint64_t file_bytes, const std::string& label) {
  const uint64_t data_bytes =
      header.data_offset <= file_bytes ? file_bytes - header.data_offset : 0;
  for (const GgufTensorInfo& info : header.tensors) {
    const std::string where = "tensor " + quotedName(info.name) + ": ";
    if (info.offset % header.alignment != 0) {
      fail(label, where + "data offset " + std::to_string(info.offset) +
                      " is not a multiple of the alignment " + std::to_string(header.alignment));
    }
    if (info.offset > data_bytes || info.byte_size > data_bytes - info.offset) {
      fail(label, where + "its " + std::to_string(info.byte_size) + " bytes at data offset " +
                      std::to_string(info.offset) +
                      " end past the end of the file (the data section at " +
                      std::to_string(header.data_offset) + " holds " + std::to_string(data_bytes) +
                      " bytes); the file is truncated");
    }
  }
  std::vector<size_t> order(header.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return header.tensors[a].offset < header.tensors[b].offset;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensorInfo& previous = header.tensors[order[i - 1]];
    const GgufTensorInfo& current = header.tensors[order[i]];
    if (current.offset < previous.offset + previous.byte_size) {
      fail(label, "tensor " + quotedName(current.name) + " at data offset " +
                      std::to_string(current.offset) + " overlaps tensor " +
                      quotedName(previous.name) + " (bytes [" + std::to_string(previous.offset) +
                      ", " + std::to_string(previous.offset + previous.byte_size) + "))");
    }
  }
}

constexpr size_t kTypeTableSize = static_cast<size_t>(GgmlType::MXFP4) + 1;

// ggml's type_traits (ggml.c): name, block size, bytes per block. Q8_1 is 36 bytes (fp16 d and s)
// as in ggml-common.h; gguf-py's GGML_QUANT_SIZES still says 40, the old float layout.
constexpr std::array<GgmlTypeTraits, kTypeTableSize> makeTypeTable() {
  std::array<GgmlTypeTraits, kTypeTableSize> t{};
  auto set = [&t](GgmlType type, std::string_view name, int64_t elems, int64_t bytes,
                  bool dequantizable) {
    t[static_cast<size_t>(type)] = {name, elems, bytes, dequantizable};
  };
  set(GgmlType::F32, "f32", 1, 4, true);
  set(GgmlType::F16, "f16", 1, 2, true);
  set(GgmlType::Q4_0, "q4_0", 32, 18, true);
  set(GgmlType::Q4_1, "q4_1", 32, 20, true);
  set(GgmlType::Q5_0, "q5_0", 32, 22, true);
  set(GgmlType::Q5_1, "q5_1", 32, 24, true);
  set(GgmlType::Q8_0, "q8_0", 32, 34, true);
  set(GgmlType::Q8_1, "q8_1", 32, 36, false);
  set(GgmlType::Q2_K, "q2_K", 256, 84, true);
  set(GgmlType::Q3_K, "q3_K", 256, 110, true);
  set(GgmlType::Q4_K, "q4_K", 256, 144, true);
  set(GgmlType::Q5_K, "q5_K", 256, 176, true);
  set(GgmlType::Q6_K, "q6_K", 256, 210, true);
  set(GgmlType::Q8_K, "q8_K", 256, 292, true);
  set(GgmlType::IQ2_XXS, "iq2_xxs", 256, 66, false);
  set(GgmlType::IQ2_XS, "iq2_xs", 256, 74, false);
  set(GgmlType::IQ3_XXS, "iq3_xxs", 256, 98, false);
  set(GgmlType::IQ1_S, "iq1_s", 256, 50, false);
  set(GgmlType::IQ4_NL, "iq4_nl", 32, 18, true);
  set(GgmlType::IQ3_S, "iq3_s", 256, 110, false);
  set(GgmlType::IQ2_S, "iq2_s", 256, 82, false);
  set(GgmlType::IQ4_XS, "iq4_xs", 256, 136, true);
  set(GgmlType::I8, "i8", 1, 1, true);
  set(GgmlType::I16, "i16", 1, 2, true);
  set(GgmlType::I32, "i32", 1, 4, true);
  set(GgmlType::I64, "i64", 1, 8, true);
  set(GgmlType::F64, "f64", 1, 8, true);
  set(GgmlType::IQ1_M, "iq1_m", 256, 56, false);
  set(GgmlType::BF16, "bf16", 1, 2, true);
  set(GgmlType::TQ1_0, "tq1_0", 256, 54, false);
  set(GgmlType::TQ2_0, "tq2_0", 256, 66, false);
  set(GgmlType::MXFP4, "mxfp4", 32, 17, true);
  return t;
}

constexpr std::array<GgmlTypeTraits, kTypeTableSize> kTypeTable = makeTypeTable();

}  // namespace

namespace gguf_detail {

bool isValidUtf8(std::string_view text) {
  const size_t n = text.size();
  auto at = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  auto is_cont = [&](size_t k) { return k < n && (at(k) & 0xC0) == 0x80; };
  size_t i = 0;
  while (i < n) {
    const uint8_t c = at(i);
    if (c < 0x80) {
      i += 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      if (!is_cont(i + 1)) return false;
      i += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      if (!is_cont(i + 1) || !is_cont(i + 2)) return false;
      if (c == 0xE0 && at(i + 1) < 0xA0) return false;   // overlong
      if (c == 0xED && at(i + 1) >= 0xA0) return false;  // UTF-16 surrogate
      i += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (!is_cont(i + 1) || !is_cont(i + 2) || !is_cont(i + 3)) return false;
      if (c == 0xF0 && at(i + 1) < 0x90) return false;   // overlong
      if (c == 0xF4 && at(i + 1) >= 0x90) return false;  // above U+10FFFF
      i += 4;
    } else {
      return false;
    }
  }
  return true;
}

bool isIntegerType(GgufValueType type) {
  switch (type) {
    case GgufValueType::UInt8:
    case GgufValueType::Int8:
    case GgufValueType::UInt16:
    case GgufValueType::Int16:
    case GgufValueType::UInt32:
    case GgufValueType::Int32:
    case GgufValueType::UInt64:
    case GgufValueType::Int64: return true;
    default: return false;
  }
}

bool isFloatType(GgufValueType type) {
  return type == GgufValueType::Float32 || type == GgufValueType::Float64;
}

}  // namespace gguf_detail

std::optional<GgmlTypeTraits> ggmlTypeTraits(uint32_t type) {
  if (type >= kTypeTable.size() || kTypeTable[type].block_bytes == 0) return std::nullopt;
  return kTypeTable[type];
}

std::string_view ggmlTypeName(GgmlType type) {
  const std::optional<GgmlTypeTraits> traits = ggmlTypeTraits(static_cast<uint32_t>(type));
  return traits ? traits->name : std::string_view("unknown");
}

std::string_view ggufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::UInt8: return "uint8";
    case GgufValueType::Int8: return "int8";
    case GgufValueType::UInt16: return "uint16";
    case GgufValueType::Int16: return "int16";
    case GgufValueType::UInt32: return "uint32";
    case GgufValueType::Int32: return "int32";
    case GgufValueType::Float32: return "float32";
    case GgufValueType::Bool: return "bool";
    case GgufValueType::String: return "string";
    case GgufValueType::Array: return "array";
    case GgufValueType::UInt64: return "uint64";
    case GgufValueType::Int64: return "int64";
    case GgufValueType::Float64: return "float64";
  }
  return "unknown";
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t dim : ne) n *= dim;  // parseGguf checked that the product fits
  return n;
}

std::vector<int64_t> GgufTensorInfo::torchShape() const { return {ne.rbegin(), ne.rend()}; }

GgufHeader parseGguf(std::span<const std::byte> file, const std::string& label) {
  if (file.empty()) fail(label, "is empty (0 bytes), not a GGUF file", "re-download the file");
  Reader in(file, label);
  const std::span<const std::byte> magic = in.take(4, "the magic \"GGUF\"");
  if (std::memcmp(magic.data(), "GGUF", 4) != 0) {
    fail(label, "does not start with the GGUF magic \"GGUF\"; it is not a GGUF file",
         "pass a .gguf file (llama.cpp's convert_hf_to_gguf.py writes them)");
  }
  GgufHeader header;
  header.version = readVersion(in, label);
  const uint64_t tensor_count = in.count("tensor_count", kMinTensorInfoBytes);
  const uint64_t kv_count = in.count("kv_count", kMinKeyValueBytes);
  if (tensor_count * kMinTensorInfoBytes > in.remaining() - kv_count * kMinKeyValueBytes) {
    fail(label, "tensor_count " + std::to_string(tensor_count) + " and kv_count " +
                    std::to_string(kv_count) + " cannot both fit in the " +
                    std::to_string(in.remaining()) + " bytes left in the file");
  }
  readMetadata(in, kv_count, header);

  std::set<std::string, std::less<>> names;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo info = readTensorInfo(in, i);
    if (!names.insert(info.name).second) in.failHere("appears twice in the tensor list");
    header.tensors.push_back(std::move(info));
  }
  // The data section starts at the next multiple of the alignment; the position is at most the
  // file size and the alignment below 2^32, so this cannot wrap.
  header.data_offset = (in.position() + header.alignment - 1) / header.alignment * header.alignment;
  checkTensorPlacement(header, file.size(), label);
  return header;
}

}  // namespace tandem::io
