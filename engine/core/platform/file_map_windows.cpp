#include <windows.h>

#include <string>

#include "engine/core/error.h"
#include "engine/core/platform/file_map.h"
#include "engine/core/platform/windows_error.h"

namespace tandem::platform {

namespace {

[[noreturn]] void throwSystemError(const std::string& action, const std::filesystem::path& path,
                                   DWORD error) {
  throw Error(action + " " + path.string() + ": " + windowsErrorCode(error).message(),
              "check that the file exists and is readable");
}

struct HandleCloser {
  HANDLE handle;
  ~HandleCloser() {
    if (handle != nullptr && handle != INVALID_HANDLE_VALUE) CloseHandle(handle);
  }
};

}  // namespace

FileMapping mapFileReadOnly(const std::filesystem::path& path) {
  // FILE_SHARE_DELETE: a mapped model file can still be replaced, as on Linux.
  HANDLE file = CreateFileW(path.c_str(), GENERIC_READ,
                            FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                            OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (file == INVALID_HANDLE_VALUE) throwSystemError("cannot open", path, GetLastError());
  HandleCloser file_closer{file};

  BY_HANDLE_FILE_INFORMATION info = {};
  if (!GetFileInformationByHandle(file, &info)) {
    throwSystemError("cannot stat", path, GetLastError());
  }
  if (info.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY || GetFileType(file) != FILE_TYPE_DISK) {
    throw Error("cannot map " + path.string() + ": not a regular file",
                "pass the path of a file, not a directory or device");
  }
  const uint64_t size = (static_cast<uint64_t>(info.nFileSizeHigh) << 32) | info.nFileSizeLow;
  FileMapping mapping;
  if (size == 0) return mapping;  // CreateFileMapping refuses an empty file
  if (size > SIZE_MAX) {
    throw Error("cannot map " + path.string() + ": file is larger than the address space");
  }
  HANDLE section = CreateFileMappingW(file, nullptr, PAGE_READONLY, 0, 0, nullptr);
  if (section == nullptr) throwSystemError("cannot map", path, GetLastError());
  HandleCloser section_closer{section};
  // The view holds its own reference to the section and the file.
  void* data = MapViewOfFile(section, FILE_MAP_READ, 0, 0, 0);
  if (data == nullptr) throwSystemError("cannot map", path, GetLastError());
  mapping.data = static_cast<const std::byte*>(data);
  mapping.size_bytes = size;
  return mapping;
}

void unmapFile(const FileMapping& mapping) noexcept {
  if (mapping.data != nullptr) UnmapViewOfFile(mapping.data);
}

void releaseMappedPages(const std::byte* data, uint64_t bytes) noexcept {
  if (bytes == 0) return;
  // Documented: VirtualUnlock on pages that are not locked takes them out of the working set (and
  // then fails with ERROR_NOT_LOCKED, which is expected here).
  VirtualUnlock(const_cast<std::byte*>(data), static_cast<SIZE_T>(bytes));
}

}  // namespace tandem::platform
