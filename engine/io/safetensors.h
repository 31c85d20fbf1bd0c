#pragma once
// safetensors reading (memory-mapped, zero-copy views) and writing (atomic).
//
// File layout: [u64 little-endian header_bytes][header_bytes of UTF-8 JSON][data section].
// The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
// to the data section) and may hold "__metadata__": {string: string}. Every claim in the header is
// validated before any tensor is handed out (see parseSafetensorsHeader).

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/io/dtype.h"
#include "engine/io/mapped_file.h"

namespace tandem::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offset in the data section
  uint64_t end = 0;    // one past the last byte

  int64_t numel() const;
  uint64_t byteSize() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
};

// Parses and validates the JSON header against the size of the data section that follows it.
// Throws tandem::Error naming `label` (usually the file path) for anything wrong. Pure function of
// its inputs: this is the libFuzzer target.
SafetensorsHeader parseSafetensorsHeader(std::span<const std::byte> header_json,
                                         uint64_t data_section_bytes, const std::string& label);

// A tensor's bytes inside a mapped file; valid as long as the file object that made it lives.
struct TensorView {
  const TensorInfo* info = nullptr;
  std::span<const std::byte> bytes;
};

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  uint64_t fileBytes() const { return map_.size(); }
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  TensorView view(const std::string& name) const;         // throws Error when absent

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  MappedFile map_;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;  // name -> position in header_.tensors
  uint64_t data_start_ = 0;
};

// A model's weights: one file, or shards listed by model.safetensors.index.json ("weight_map").
// Opening a directory prefers the index, then model.safetensors, then the only *.safetensors.
class SafetensorsModel {
 public:
  static SafetensorsModel open(const std::filesystem::path& dir_or_file);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  const TensorInfo* find(const std::string& name) const;
  TensorView view(const std::string& name) const;  // throws Error naming the tensor
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  uint64_t totalFileBytes() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> owner_;  // tensor name -> index in files_
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // exactly numel * dtypeSize bytes
};

// Writes a .safetensors file atomically (temp file in the same directory, fsync, rename).
// Tensors are laid out in the order given, 8-byte aligned header as the reference writer does.
void writeSafetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace tandem::io
