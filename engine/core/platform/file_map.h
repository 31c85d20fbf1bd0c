#pragma once
// A whole file mapped read-only into memory. Linux: open + mmap(PROT_READ, MAP_PRIVATE). Windows:
// CreateFileW + CreateFileMappingW(PAGE_READONLY) + MapViewOfFile(FILE_MAP_READ). The mapping
// keeps the file's contents alive on its own; io::MappedFile is the owner that unmaps.

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace tandem::platform {

struct FileMapping {
  const std::byte* data = nullptr;  // nullptr for a zero-byte file (no mapping is made)
  uint64_t size_bytes = 0;
};

// Throws tandem::Error naming the path when the file cannot be opened, is not a regular file, is
// larger than the address space or cannot be mapped.
FileMapping mapFileReadOnly(const std::filesystem::path& path);

// Unmaps what mapFileReadOnly returned (nothing for a zero-byte file).
void unmapFile(const FileMapping& mapping) noexcept;

// Takes the whole pages inside [data, data + bytes) of a mapFileReadOnly mapping out of this
// process's resident set: for bytes read once (a checkpoint's weights repacked at load), so that
// they do not count twice beside their copy. The mapping stays valid (a later read faults the page
// back in from the file). Linux: madvise(MADV_DONTNEED); Windows: VirtualUnlock, which takes
// unlocked pages out of the working set.
void releaseMappedPages(const std::byte* data, uint64_t bytes) noexcept;

}  // namespace tandem::platform
