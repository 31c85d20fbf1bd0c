// SafetensorsFile (mmap + validated header), SafetensorsModel (single file or index + shards) and
// writeSafetensors. Header validation itself lives in safetensors_header.cpp.

#include "engine/io/safetensors.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "engine/core/error.h"
#include "engine/io/atomic_file.h"
#include "engine/io/bounded_json.h"

namespace tandem::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kLengthPrefixBytes = 8;
// Same cap as the reference implementation: real headers are a few MB even for 100k tensors,
// and a larger claim is a cheap way to make a reader allocate without bound.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
constexpr std::string_view kSingleFileName = "model.safetensors";

uint64_t readU64LittleEndian(const std::byte* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(p[i]);
  return value;
}

std::string quoted(const fs::path& path) { return path.string(); }

// ---- index files ---------------------------------------------------------------------------

bool isSafeShardName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find("..") == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// Reads weight_map {tensor: shard file name} from an index file; metadata (total_size) is unused.
std::map<std::string, std::string> readWeightMap(const fs::path& index_path) {
  const MappedFile index_file = MappedFile::open(index_path);
  const json root = parseBoundedJson(
      std::string_view(reinterpret_cast<const char*>(index_file.data()), index_file.size()),
      kSafetensorsIndexJsonLimits, quoted(index_path));
  if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object()) {
    throw Error(quoted(index_path) + ": has no \"weight_map\" object",
                "re-download the index file; it should map tensor names to shard files");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, shard] : root["weight_map"].items()) {
    if (!shard.is_string()) {
      throw Error(quoted(index_path) + ": weight_map entry for tensor \"" +
                      excerptForMessage(tensor) + "\" is not a file name string",
                  "re-download the index file");
    }
    const std::string& shard_name = shard.get_ref<const std::string&>();
    if (!isSafeShardName(shard_name)) {
      throw Error(quoted(index_path) + ": tensor \"" + excerptForMessage(tensor) +
                      "\" points to shard \"" + excerptForMessage(shard_name) +
                      "\", which is not a plain file name (no '/', '\\' or '..' allowed)",
                  "shards must sit next to the index file; fix or re-download the index");
    }
    weight_map.emplace(tensor, shard_name);
  }
  return weight_map;
}

// Without an index: model.safetensors, else the only *.safetensors file in the directory.
fs::path findSingleFile(const fs::path& dir) {
  if (fs::is_regular_file(dir / kSingleFileName)) return dir / kSingleFileName;
  std::vector<fs::path> candidates;
  std::vector<std::string> seen;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    seen.push_back(entry.path().filename().string());
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") {
      candidates.push_back(entry.path());
    }
  }
  std::sort(seen.begin(), seen.end());
  std::sort(candidates.begin(), candidates.end());
  if (candidates.size() == 1) return candidates.front();
  auto list = [](const std::vector<std::string>& names) {
    std::string text;
    for (size_t i = 0; i < names.size() && i < 20; ++i) text += (i ? ", " : "") + names[i];
    if (names.size() > 20) text += ", ... (" + std::to_string(names.size()) + " entries)";
    return names.empty() ? std::string("nothing") : text;
  };
  if (candidates.empty()) {
    throw Error("no .safetensors file in " + quoted(dir) + " (found: " + list(seen) + ")",
                "point to a Hugging Face model directory or a .safetensors file");
  }
  std::vector<std::string> names;
  for (const fs::path& p : candidates) names.push_back(p.filename().string());
  throw Error(quoted(dir) + " holds several .safetensors files (" + list(names) + ") but no " +
                  std::string(kIndexFileName),
              "add the index file that came with the model, or pass one file's path");
}

// ---- writing -------------------------------------------------------------------------------

uint64_t checkedTensorBytes(const fs::path& path, const TensorToWrite& tensor) {
  uint64_t numel = 1;
  for (int64_t dim : tensor.shape) {
    if (dim < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel)) {
      throw Error("cannot write " + quoted(path) + ": tensor \"" + tensor.name +
                  "\" has a negative or overflowing shape");
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtypeSize(tensor.dtype)), &bytes)) {
    throw Error("cannot write " + quoted(path) + ": tensor \"" + tensor.name + "\" is too large");
  }
  if (bytes != tensor.bytes.size()) {
    throw Error("cannot write " + quoted(path) + ": tensor \"" + tensor.name + "\" has " +
                std::to_string(tensor.bytes.size()) + " bytes but its shape and dtype " +
                std::string(dtypeName(tensor.dtype)) + " need " + std::to_string(bytes));
  }
  return bytes;
}

// The header exactly as the reference writer lays it out: JSON, then spaces so that the data
// section starts at a multiple of 8 bytes from the start of the file.
std::string buildHeader(const fs::path& path, std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    if (tensor.name.empty() || tensor.name == "__metadata__" || !names.insert(tensor.name).second) {
      throw Error("cannot write " + quoted(path) + ": tensor name \"" + tensor.name +
                  "\" is empty, reserved or used twice");
    }
    const uint64_t bytes = checkedTensorBytes(path, tensor);
    header[tensor.name] = {{"dtype", dtypeName(tensor.dtype)},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error("cannot write " + quoted(path) +
                ": a tensor name or metadata entry is not valid "
                "UTF-8 (" +
                e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

// ---- SafetensorsFile -------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const fs::path& path) {
  SafetensorsFile file;
  file.path_ = path;
  file.map_ = MappedFile::open(path);
  const uint64_t file_bytes = file.map_.size();
  const std::string label = quoted(path);
  if (file_bytes < kLengthPrefixBytes) {
    throw Error(label + ": file is shorter than 8 bytes (" + std::to_string(file_bytes) +
                    " bytes); it is not a safetensors file or it is truncated",
                "re-download the file");
  }
  const uint64_t header_bytes = readU64LittleEndian(file.map_.data());
  // Compare against the remaining size instead of computing 8 + header_bytes, which can wrap.
  if (header_bytes > file_bytes - kLengthPrefixBytes) {
    throw Error(label + ": header length " + std::to_string(header_bytes) +
                    " is past the end of the file (" + std::to_string(file_bytes) + " bytes)",
                "re-download the file; it is truncated or not a safetensors file");
  }
  if (header_bytes > kMaxHeaderBytes) {
    throw Error(label + ": header length " + std::to_string(header_bytes) +
                    " bytes is larger than the 100 MB limit",
                "this is not a valid safetensors file; re-export it");
  }
  file.data_start_ = kLengthPrefixBytes + header_bytes;
  const std::span<const std::byte> header_json(file.map_.data() + kLengthPrefixBytes,
                                               static_cast<size_t>(header_bytes));
  file.header_ = parseSafetensorsHeader(header_json, file_bytes - file.data_start_, label);
  for (size_t i = 0; i < file.header_.tensors.size(); ++i) {
    file.index_.emplace(file.header_.tensors[i].name, i);
  }
  return file;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (info == nullptr) {
    throw Error(quoted(path_) + ": has no tensor \"" + name + "\"",
                "check the tensor name; `tandem inspect` lists what the file holds");
  }
  // Offsets were checked against the data section when the header was parsed.
  return {info, {map_.data() + data_start_ + info->begin, static_cast<size_t>(info->byteSize())}};
}

// ---- SafetensorsModel ------------------------------------------------------------------------

SafetensorsModel SafetensorsModel::open(const fs::path& dir_or_file) {
  SafetensorsModel model;
  std::error_code ec;
  const fs::file_status status = fs::status(dir_or_file, ec);
  if (ec || !fs::exists(status)) {
    throw Error("model path " + quoted(dir_or_file) + " does not exist",
                "check the path to the model directory or .safetensors file");
  }
  const bool is_index =
      fs::is_regular_file(status) && dir_or_file.filename().string().ends_with(".index.json");
  const fs::path dir = fs::is_directory(status) ? dir_or_file : dir_or_file.parent_path();
  const fs::path index_path = is_index ? dir_or_file : dir / kIndexFileName;

  if (!is_index && (fs::is_regular_file(status) || !fs::is_regular_file(index_path))) {
    const fs::path single = fs::is_regular_file(status) ? dir_or_file : findSingleFile(dir);
    model.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(single)));
    for (const TensorInfo& info : model.files_.back()->header().tensors)
      model.owner_[info.name] = 0;
    return model;
  }

  const std::map<std::string, std::string> weight_map = readWeightMap(index_path);
  std::map<std::string, size_t> shard_index;  // shard file name -> index in files_
  for (const auto& [tensor, shard] : weight_map) {
    if (shard_index.contains(shard)) continue;
    const fs::path shard_path = dir / shard;
    if (!fs::is_regular_file(shard_path)) {
      throw Error(quoted(index_path) + " lists shard \"" + shard + "\" (for tensor \"" + tensor +
                      "\"), but " + quoted(shard_path) + " does not exist",
                  "download the missing shard file into " + quoted(dir));
    }
    shard_index.emplace(shard, model.files_.size());
    model.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(shard_path)));
  }
  // Every tensor of every shard has exactly one owner, so a lookup never depends on which shard
  // happened to be opened first.
  for (size_t i = 0; i < model.files_.size(); ++i) {
    for (const TensorInfo& info : model.files_[i]->header().tensors) {
      const auto [it, inserted] = model.owner_.emplace(info.name, i);
      if (!inserted) {
        throw Error("tensor \"" + info.name +
                        "\" appears in two shards: " + quoted(model.files_[it->second]->path()) +
                        " and " + quoted(model.files_[i]->path()),
                    "the shards come from different exports; re-download the model");
      }
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    const size_t expected = shard_index.at(shard);
    const auto it = model.owner_.find(tensor);
    if (it == model.owner_.end() || it->second != expected) {
      throw Error(quoted(index_path) + " puts tensor \"" + tensor + "\" in shard \"" + shard +
                      "\", but that shard does not contain it",
                  "the index and the shards do not match; re-download the model");
    }
  }
  return model;
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> result;
  result.reserve(owner_.size());
  for (const auto& entry : owner_) result.push_back(entry.first);
  return result;
}

bool SafetensorsModel::contains(const std::string& name) const { return owner_.contains(name); }

const TensorInfo* SafetensorsModel::find(const std::string& name) const {
  const auto it = owner_.find(name);
  return it == owner_.end() ? nullptr : files_[it->second]->find(name);
}

TensorView SafetensorsModel::view(const std::string& name) const {
  const auto it = owner_.find(name);
  if (it == owner_.end()) {
    const std::string where =
        files_.empty() ? std::string("the model") : quoted(files_.front()->path().parent_path());
    throw Error("model in " + where + " has no tensor \"" + name + "\"",
                "check the tensor name; `tandem inspect` lists what the model holds");
  }
  return files_[it->second]->view(name);
}

uint64_t SafetensorsModel::totalFileBytes() const {
  uint64_t total = 0;
  for (const auto& file : files_) total += file->fileBytes();
  return total;
}

// ---- writing -------------------------------------------------------------------------------

void writeSafetensors(const fs::path& path, std::span<const TensorToWrite> tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string header = buildHeader(path, tensors, metadata);
  std::array<unsigned char, 8> length_prefix{};
  for (size_t i = 0; i < 8; ++i)
    length_prefix[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  writeFileAtomically(path, [&](std::FILE* out) {
    std::fwrite(length_prefix.data(), 1, length_prefix.size(), out);
    std::fwrite(header.data(), 1, header.size(), out);
    for (const TensorToWrite& tensor : tensors) {
      if (!tensor.bytes.empty()) std::fwrite(tensor.bytes.data(), 1, tensor.bytes.size(), out);
    }
  });
}

}  // namespace tandem::io
