#pragma once
// MappedFile: a whole file mapped read-only into memory, unmapped when the object dies.
// Move-only. Zero-byte files are represented without a mapping (mmap refuses length 0).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

namespace tandem::io {

class MappedFile {
 public:
  MappedFile() = default;  // empty: data() == nullptr, size() == 0
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Throws tandem::Error naming the path and the system's reason when the file cannot be mapped.
  static MappedFile open(const std::filesystem::path& path);

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_bytes_; }
  std::span<const std::byte> bytes() const { return {data_, static_cast<size_t>(size_bytes_)}; }

 private:
  void reset() noexcept;

  const std::byte* data_ = nullptr;
  uint64_t size_bytes_ = 0;
};

}  // namespace tandem::io
