#include <windows.h>

#include "engine/core/platform/file_lock.h"
#include "engine/core/platform/windows_error.h"

namespace tandem::platform {

namespace {

// The locked byte: past any note, so ReadFile of the note by a turned-away process succeeds
// (a LockFileEx range blocks reads of itself, not of the rest of the file).
constexpr DWORD kLockOffsetHigh = 0x7fffffff;

HANDLE asHandle(intptr_t handle) { return reinterpret_cast<HANDLE>(handle); }

}  // namespace

std::optional<FileLock> FileLock::tryAcquire(const std::filesystem::path& path,
                                             std::error_code& error) {
  error.clear();
  HANDLE handle = CreateFileW(path.c_str(), GENERIC_READ | GENERIC_WRITE,
                              FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                              OPEN_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (handle == INVALID_HANDLE_VALUE) {
    error = windowsErrorCode(GetLastError());
    return std::nullopt;
  }
  OVERLAPPED at{};
  at.OffsetHigh = kLockOffsetHigh;
  // Locks belong to the handle: a second handle, even in this process, is refused, and the OS
  // drops the lock when the process ends.
  if (!LockFileEx(handle, LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &at)) {
    const DWORD e = GetLastError();
    CloseHandle(handle);
    if (e != ERROR_LOCK_VIOLATION && e != ERROR_IO_PENDING) error = windowsErrorCode(e);
    return std::nullopt;
  }
  return FileLock(reinterpret_cast<intptr_t>(handle));
}

std::error_code FileLock::writeNote(std::string_view note) {
  HANDLE handle = asHandle(handle_);
  LARGE_INTEGER start{};
  DWORD written = 0;
  if (!SetFilePointerEx(handle, start, nullptr, FILE_BEGIN) ||
      !WriteFile(handle, note.data(), static_cast<DWORD>(note.size()), &written, nullptr) ||
      !SetEndOfFile(handle)) {
    return windowsErrorCode(GetLastError());
  }
  if (written != note.size()) return std::make_error_code(std::errc::io_error);
  return {};
}

void FileLock::release() {
  if (handle_ != -1) CloseHandle(asHandle(handle_));  // closing the handle unlocks
  handle_ = -1;
}

}  // namespace tandem::platform
