#pragma once
// GGUF reading (memory-mapped, validated) and writing (atomic), as llama.cpp's gguf.cpp and the
// PyPI `gguf` package define the format (versions 2 and 3, little-endian):
//
//   magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count × (string key | u32 value_type | value)            string = u64 length + UTF-8 bytes
//   tensor_count × (string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset)
//   padding to `general.alignment` (default 32) | data section (each offset aligned, relative to
//   it)
//
// Shapes are kept in ggml order: ne[0] is the contiguous (innermost) dimension, so a torch weight
// [out, in] is ne = {in, out}. Every claim in the file is validated before a tensor is handed out.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "engine/io/mapped_file.h"

namespace tandem::io {

// ggml_type values (ggml.h). Types the reader does not know are refused by number.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct GgmlTypeTraits {
  std::string_view name;       // ggml's spelling: "q4_K", "bf16", ...
  int64_t block_elems = 1;     // elements per block (1 for plain types)
  int64_t block_bytes = 0;     // bytes per block
  bool dequantizable = false;  // dequantizeGgml() converts it
};
// nullopt for a value that is not a ggml type this reader knows.
std::optional<GgmlTypeTraits> ggmlTypeTraits(uint32_t type);
std::string_view ggmlTypeName(GgmlType type);

// Converts `numel` elements stored as `type` (ggml's block structs, little-endian) to fp32, exactly
// as ggml's dequantize_row_* does. `bytes` must be numel / block_elems × block_bytes long and numel
// a multiple of block_elems; anything else, or a type without a dequantizer (the IQ1/IQ2/IQ3 grids,
// TQ*, Q8_1), is an Error naming `what` (the tensor).
void dequantizeGgml(GgmlType type, std::span<const std::byte> bytes, int64_t numel, float* out,
                    std::string_view what);

enum class GgufValueType : uint32_t {
  UInt8 = 0,
  Int8 = 1,
  UInt16 = 2,
  Int16 = 3,
  UInt32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  UInt64 = 10,
  Int64 = 11,
  Float64 = 12,
};
std::string_view ggufValueTypeName(GgufValueType type);

// One metadata value. Integers of every width are held as int64_t (uint64 values above INT64_MAX
// are refused at read), floats as double; `type` / `element_type` keep the stored width so that
// a file read and written again is the same file. Arrays of arrays are refused.
struct GgufValue {
  GgufValueType type = GgufValueType::UInt32;
  GgufValueType element_type = GgufValueType::UInt32;  // arrays only
  std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<double>,
               std::vector<bool>, std::vector<std::string>>
      value;

  static GgufValue ofString(std::string s);
  static GgufValue ofUInt32(uint32_t v);
  static GgufValue ofInt64(int64_t v, GgufValueType type = GgufValueType::Int64);
  static GgufValue ofFloat32(float v);
  static GgufValue ofBool(bool v);
  static GgufValue ofStrings(std::vector<std::string> v);
  static GgufValue ofInts(std::vector<int64_t> v, GgufValueType element_type);
  static GgufValue ofFloats(std::vector<double> v, GgufValueType element_type);
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;  // ggml order, ne[0] innermost; 1 to 4 dimensions
  uint64_t offset = 0;      // in the data section
  uint64_t byte_size = 0;   // numel / block_elems × block_bytes

  int64_t numel() const;
  std::vector<int64_t> torchShape() const;  // ne reversed: [ne[n-1], ..., ne[0]]
};

struct GgufHeader {
  uint32_t version = 3;
  uint64_t alignment = 32;   // general.alignment, a power of two
  uint64_t data_offset = 0;  // where the data section starts in the file
  std::vector<std::pair<std::string, GgufValue>> metadata;  // in file order, keys unique
  std::vector<GgufTensorInfo> tensors;                      // in file order, names unique
};

// Parses and validates everything before the data section of `file` (the whole file's bytes):
// magic, version (2 or 3; a byte-swapped version says big-endian), counts that the file could
// hold, string lengths, UTF-8 of keys and names, value and element types, dims (1-4, each ≥ 1,
// product without overflow), tensor types, ne[0] a multiple of the block size, each offset aligned
// and every tensor inside the file without overlapping another. Throws tandem::Error naming
// `label` and the key or tensor. Pure function of its input: the libFuzzer target.
GgufHeader parseGguf(std::span<const std::byte> file, const std::string& label);

// One memory-mapped .gguf file.
class GgufFile {
 public:
  static GgufFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const GgufHeader& header() const { return header_; }
  uint64_t fileBytes() const { return map_.size(); }

  const GgufValue* find(std::string_view key) const;  // nullptr when absent
  // Typed getters. Missing key or another type: Error naming the key and the file. getInt takes
  // every integer width; getFloat also takes integers.
  std::string getString(std::string_view key) const;
  int64_t getInt(std::string_view key) const;
  double getFloat(std::string_view key) const;
  bool getBool(std::string_view key) const;
  std::optional<std::string> optString(std::string_view key) const;
  std::optional<int64_t> optInt(std::string_view key) const;
  std::optional<double> optFloat(std::string_view key) const;
  std::optional<bool> optBool(std::string_view key) const;
  const std::vector<std::string>& getStrings(std::string_view key) const;
  const std::vector<int64_t>& getInts(std::string_view key) const;
  const std::vector<double>& getFloats(std::string_view key) const;

  const GgufTensorInfo* findTensor(std::string_view name) const;  // nullptr when absent
  std::span<const std::byte> tensorBytes(const GgufTensorInfo& tensor) const;
  // The tensor as fp32 (dequantised), ggml order flattened: element (i0, i1, ...) at
  // i0 + ne0 * (i1 + ne1 * ...). Error naming the tensor when its type has no dequantizer.
  std::vector<float> dequantize(const GgufTensorInfo& tensor) const;

 private:
  GgufFile() = default;
  std::filesystem::path path_;
  MappedFile map_;
  GgufHeader header_;
  std::map<std::string, size_t, std::less<>> key_index_;     // key -> position in metadata
  std::map<std::string, size_t, std::less<>> tensor_index_;  // name -> position in tensors
};

struct GgufTensorToWrite {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;           // ggml order
  std::span<const std::byte> bytes;  // exactly the type's size for ne
};

// Writes a GGUF v3 file atomically (temp file in the same directory, fsync, rename): metadata in
// the order given (general.alignment is written when `alignment` is not 32), tensors in the order
// given, each at an offset aligned to `alignment`, zero padding between them, as gguf-py's
// GGUFWriter lays them out. Errors name the path and the reason.
void writeGguf(const std::filesystem::path& path,
               const std::vector<std::pair<std::string, GgufValue>>& metadata,
               std::span<const GgufTensorToWrite> tensors, uint64_t alignment = 32);

}  // namespace tandem::io
