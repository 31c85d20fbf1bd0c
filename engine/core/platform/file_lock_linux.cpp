#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

#include "engine/core/platform/file_lock.h"

namespace tandem::platform {

std::optional<FileLock> FileLock::tryAcquire(const std::filesystem::path& path,
                                             std::error_code& error) {
  error.clear();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = std::error_code(errno, std::generic_category());
    return std::nullopt;
  }
  // flock belongs to the open file description: a second open() of the same file, even in this
  // process, is refused, and the lock goes with the last descriptor (at exit, or a kill).
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd);
    if (e != EWOULDBLOCK) error = std::error_code(e, std::generic_category());
    return std::nullopt;
  }
  return FileLock(fd);
}

std::error_code FileLock::writeNote(std::string_view note) {
  const int fd = static_cast<int>(handle_);
  if (::ftruncate(fd, 0) != 0) return {errno, std::generic_category()};
  const ssize_t written = ::pwrite(fd, note.data(), note.size(), 0);
  if (written != static_cast<ssize_t>(note.size()))
    return std::make_error_code(std::errc::io_error);
  return {};
}

void FileLock::release() {
  if (handle_ >= 0) ::close(static_cast<int>(handle_));  // closing drops the flock
  handle_ = -1;
}

}  // namespace tandem::platform
