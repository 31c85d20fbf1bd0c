#include "engine/io/mapped_file.h"

#include <utility>

#include "engine/core/platform/file_map.h"

namespace tandem::io {

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

void MappedFile::reset() noexcept {
  platform::unmapFile(platform::FileMapping{data_, size_bytes_});
  data_ = nullptr;
  size_bytes_ = 0;
}

MappedFile MappedFile::open(const std::filesystem::path& path) {
  const platform::FileMapping mapping = platform::mapFileReadOnly(path);
  MappedFile file;
  file.data_ = mapping.data;
  file.size_bytes_ = mapping.size_bytes;
  return file;
}

}  // namespace tandem::io
