#pragma once
// An exclusive advisory lock on a file, held for the life of the object and released by the OS
// when the process ends however it ends (a SIGKILLed holder blocks nobody). Linux: open +
// flock(LOCK_EX | LOCK_NB). Windows: CreateFileW + LockFileEx(LOCKFILE_EXCLUSIVE_LOCK |
// LOCKFILE_FAIL_IMMEDIATELY) on one byte far past the end, so the holder's note in the file stays
// readable to the processes it turns away.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>
#include <system_error>

namespace tandem::platform {

class FileLock {
 public:
  // Takes the lock on `path` (created if missing) without waiting. nullopt with `error` clear:
  // another holder (this process's own other FileLock on the file counts too); nullopt with
  // `error` set: the file could not be opened or locked at all.
  static std::optional<FileLock> tryAcquire(const std::filesystem::path& path,
                                            std::error_code& error);

  // Replaces the file's contents with `note` (who holds it), for the ones turned away to read.
  std::error_code writeNote(std::string_view note);

  FileLock(FileLock&& other) noexcept : handle_(other.handle_) { other.handle_ = -1; }
  FileLock& operator=(FileLock&& other) noexcept {
    if (this != &other) {
      release();
      handle_ = other.handle_;
      other.handle_ = -1;
    }
    return *this;
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() { release(); }

 private:
  explicit FileLock(intptr_t handle) : handle_(handle) {}
  void release();  // the OS half: closes the handle, which drops the lock

  intptr_t handle_ = -1;  // a descriptor on Linux, a HANDLE on Windows; -1 when moved from
};

}  // namespace tandem::platform
