#include <fcntl.h>
#include <io.h>
#include <windows.h>

#include "engine/core/platform/durable_file.h"
#include "engine/core/platform/windows_error.h"

namespace tandem::platform {

namespace {
std::error_code lastError() { return windowsErrorCode(GetLastError()); }
}  // namespace

std::FILE* createNewFileForWriting(const std::filesystem::path& path, std::error_code& error) {
  // CREATE_NEW fails if anything is at the name, as O_EXCL does.
  HANDLE handle = CreateFileW(path.c_str(), GENERIC_WRITE, FILE_SHARE_READ | FILE_SHARE_DELETE,
                              nullptr, CREATE_NEW, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (handle == INVALID_HANDLE_VALUE) {
    error = lastError();
    return nullptr;
  }
  // The C runtime descriptor, then the stream, each take over the one before.
  const int fd = _open_osfhandle(reinterpret_cast<intptr_t>(handle), _O_WRONLY | _O_BINARY);
  if (fd < 0) {
    error = std::make_error_code(std::errc::too_many_files_open);
    CloseHandle(handle);
    DeleteFileW(path.c_str());
    return nullptr;
  }
  std::FILE* file = _fdopen(fd, "wb");
  if (file == nullptr) {
    error = std::make_error_code(std::errc::not_enough_memory);
    _close(fd);
    DeleteFileW(path.c_str());
    return nullptr;
  }
  error.clear();
  return file;
}

std::error_code flushFileToDisk(std::FILE* file) {
  if (std::fflush(file) != 0) return std::make_error_code(std::errc::io_error);
  const auto handle = reinterpret_cast<HANDLE>(_get_osfhandle(_fileno(file)));
  if (handle == INVALID_HANDLE_VALUE || !FlushFileBuffers(handle)) return lastError();
  return {};
}

std::error_code replaceFile(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (!MoveFileExW(from.c_str(), to.c_str(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) {
    return lastError();
  }
  return {};
}

// MOVEFILE_WRITE_THROUGH already waited for the rename to reach the disk; NTFS has no directory
// flush to add.
std::error_code flushDirectoryToDisk(const std::filesystem::path& /*dir*/) { return {}; }

std::error_code appendInOneWrite(const std::filesystem::path& path, std::string_view text) {
  HANDLE file = CreateFileW(path.c_str(), FILE_APPEND_DATA, FILE_SHARE_READ | FILE_SHARE_WRITE,
                            nullptr, OPEN_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (file == INVALID_HANDLE_VALUE) return lastError();
  DWORD written = 0;
  const BOOL ok = WriteFile(file, text.data(), static_cast<DWORD>(text.size()), &written, nullptr);
  CloseHandle(file);
  if (!ok || written != text.size()) return std::make_error_code(std::errc::io_error);
  return {};
}

// windowsErrorCode made the disk-full codes errc::no_space_on_device.
bool isDiskFull(const std::error_code& error) { return error == std::errc::no_space_on_device; }

}  // namespace tandem::platform
