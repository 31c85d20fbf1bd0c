#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "engine/core/error.h"
#include "engine/core/platform/file_map.h"

namespace tandem::platform {

namespace {

[[noreturn]] void throwSystemError(const std::string& action, const std::filesystem::path& path,
                                   int errno_value) {
  throw Error(action + " " + path.string() + ": " + std::strerror(errno_value),
              "check that the file exists and is readable");
}

// Closes the descriptor on every path out of open(); the mapping keeps the file alive on its own.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}  // namespace

FileMapping mapFileReadOnly(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throwSystemError("cannot open", path, errno);
  FdCloser closer{fd};

  struct stat st {};
  if (::fstat(fd, &st) != 0) throwSystemError("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    throw Error("cannot map " + path.string() + ": not a regular file",
                "pass the path of a file, not a directory or device");
  }
  FileMapping mapping;
  if (st.st_size == 0) return mapping;  // mmap of length 0 is EINVAL; an empty file has no bytes
  if (static_cast<uint64_t>(st.st_size) > SIZE_MAX) {
    throw Error("cannot map " + path.string() + ": file is larger than the address space");
  }
  // No MAP_POPULATE: model files are often larger than what we touch, and we do not want to wait
  // for I/O of pages that are never read.
  void* data = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (data == MAP_FAILED) throwSystemError("cannot map", path, errno);
  mapping.data = static_cast<const std::byte*>(data);
  mapping.size_bytes = static_cast<uint64_t>(st.st_size);
  return mapping;
}

void unmapFile(const FileMapping& mapping) noexcept {
  if (mapping.data == nullptr) return;
  // munmap only fails for arguments we never produce; nothing useful to do in a destructor.
  ::munmap(const_cast<std::byte*>(mapping.data), static_cast<size_t>(mapping.size_bytes));
}

void releaseMappedPages(const std::byte* data, uint64_t bytes) noexcept {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  // Only pages wholly inside the range; on a read-only private file mapping DONTNEED drops the
  // page table entries, never data. A failure leaves the pages resident: nothing to report.
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace tandem::platform
