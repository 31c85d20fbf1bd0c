#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "engine/core/platform/durable_file.h"

namespace tandem::platform {

namespace {
std::error_code lastError() { return std::error_code(errno, std::generic_category()); }
}  // namespace

std::FILE* createNewFileForWriting(const std::filesystem::path& path, std::error_code& error) {
  // O_EXCL: never write through a file (or symlink) someone else put at this name.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = lastError();
    return nullptr;
  }
  std::FILE* file = ::fdopen(fd, "wb");
  if (file == nullptr) {
    error = lastError();
    ::close(fd);
    ::unlink(path.c_str());
    return nullptr;
  }
  error.clear();
  return file;
}

std::error_code flushFileToDisk(std::FILE* file) {
  if (std::fflush(file) != 0) return lastError();
  if (::fsync(::fileno(file)) != 0) return lastError();
  return {};
}

std::error_code replaceFile(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return lastError();
  return {};
}

std::error_code flushDirectoryToDisk(const std::filesystem::path& dir) {
  const std::filesystem::path to_open = dir.empty() ? std::filesystem::path(".") : dir;
  const int fd = ::open(to_open.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return lastError();
  const int rc = ::fsync(fd);
  const int saved_errno = errno;
  ::close(fd);
  if (rc != 0 && saved_errno != EINVAL && saved_errno != ENOTSUP) {
    return std::error_code(saved_errno, std::generic_category());
  }
  return {};
}

std::error_code appendInOneWrite(const std::filesystem::path& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return lastError();
  const ssize_t written = ::write(fd, text.data(), text.size());
  ::close(fd);
  if (written != static_cast<ssize_t>(text.size()))
    return std::make_error_code(std::errc::io_error);
  return {};
}

bool isDiskFull(const std::error_code& error) {
  return error == std::errc::no_space_on_device || error.value() == EDQUOT;
}

}  // namespace tandem::platform
