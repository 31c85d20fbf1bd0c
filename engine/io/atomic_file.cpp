#include "engine/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "engine/core/error.h"

namespace tandem::io {

namespace {

std::atomic<uint64_t> g_temp_counter{0};

[[noreturn]] void throwWriteError(const std::string& action, const std::filesystem::path& path,
                                  int errno_value) {
  throw Error(
      "cannot write " + path.string() + ": " + action + " failed: " + std::strerror(errno_value),
      errno_value == ENOSPC ? "free some disk space and try again"
                            : "check that the directory exists and is writable");
}

// Temp name in the target's directory; pid + counter keeps concurrent writers (threads or
// processes) from clobbering each other's temp files.
std::filesystem::path tempPathFor(const std::filesystem::path& path) {
  const std::string name = "." + path.filename().string() + ".tmp." + std::to_string(::getpid()) +
                           "." + std::to_string(g_temp_counter.fetch_add(1));
  return path.parent_path() / name;
}

void fsyncDirectory(const std::filesystem::path& dir, const std::filesystem::path& target) {
  const std::filesystem::path to_open = dir.empty() ? std::filesystem::path(".") : dir;
  const int fd = ::open(to_open.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throwWriteError("opening its directory", target, errno);
  const int rc = ::fsync(fd);
  const int saved_errno = errno;
  ::close(fd);
  // Some file systems (e.g. certain FUSE/network mounts) cannot fsync directories; the rename
  // already happened, so only report real I/O errors.
  if (rc != 0 && saved_errno != EINVAL && saved_errno != ENOTSUP) {
    throwWriteError("syncing its directory", target, saved_errno);
  }
}

// Owns the temp file until commit: closes and removes it on every failure path.
class TempFile {
 public:
  explicit TempFile(const std::filesystem::path& target)
      : target_(target), temp_(tempPathFor(target)) {
    // O_EXCL: never write through a file (or symlink) someone else put at the temp name.
    const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throwWriteError("creating a temp file", target_, errno);
    file_ = ::fdopen(fd, "wb");
    if (file_ == nullptr) {
      const int saved_errno = errno;
      ::close(fd);
      ::unlink(temp_.c_str());
      throwWriteError("opening a temp file", target_, saved_errno);
    }
  }
  ~TempFile() {
    if (file_ != nullptr) std::fclose(file_);
    if (!committed_) ::unlink(temp_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  std::FILE* stream() const { return file_; }

  void commit() {
    if (std::ferror(file_) != 0) throwWriteError("writing", target_, errno != 0 ? errno : EIO);
    if (std::fflush(file_) != 0) throwWriteError("flushing", target_, errno);
    if (::fsync(::fileno(file_)) != 0) throwWriteError("fsync", target_, errno);
    const int rc = std::fclose(file_);
    file_ = nullptr;
    if (rc != 0) throwWriteError("closing", target_, errno);
    if (::rename(temp_.c_str(), target_.c_str()) != 0) throwWriteError("renaming", target_, errno);
    committed_ = true;
    fsyncDirectory(target_.parent_path(), target_);
  }

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

}  // namespace

void writeFileAtomically(const std::filesystem::path& path,
                         const std::function<void(std::FILE*)>& write_body) {
  if (path.filename().empty()) {
    throw Error("cannot write " + path.string() + ": the path names a directory, not a file",
                "give a file name");
  }
  TempFile temp(path);
  errno = 0;
  write_body(temp.stream());
  temp.commit();
}

void writeFileAtomically(const std::filesystem::path& path, std::string_view contents) {
  writeFileAtomically(path, [&](std::FILE* out) {
    if (!contents.empty()) std::fwrite(contents.data(), 1, contents.size(), out);
  });
}

}  // namespace tandem::io
