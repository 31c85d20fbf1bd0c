#include "engine/io/atomic_file.h"

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>
#include <system_error>

#include "engine/core/error.h"
#include "engine/core/platform/durable_file.h"
#include "engine/core/platform/process_info.h"

namespace tandem::io {

namespace {

std::atomic<uint64_t> g_temp_counter{0};

[[noreturn]] void throwWriteError(const std::string& action, const std::filesystem::path& path,
                                  const std::error_code& error) {
  throw Error("cannot write " + path.string() + ": " + action + " failed: " + error.message(),
              platform::isDiskFull(error) ? "free some disk space and try again"
                                          : "check that the directory exists and is writable");
}

std::error_code errnoOr(int fallback) {
  return std::error_code(errno != 0 ? errno : fallback, std::generic_category());
}

// Temp name in the target's directory; pid + counter keeps concurrent writers (threads or
// processes) from clobbering each other's temp files.
std::filesystem::path tempPathFor(const std::filesystem::path& path) {
  const std::string name = "." + path.filename().string() + ".tmp." +
                           std::to_string(platform::currentProcessId()) + "." +
                           std::to_string(g_temp_counter.fetch_add(1));
  return path.parent_path() / name;
}

// Owns the temp file until commit: closes and removes it on every failure path.
class TempFile {
 public:
  explicit TempFile(const std::filesystem::path& target)
      : target_(target), temp_(tempPathFor(target)) {
    std::error_code error;
    file_ = platform::createNewFileForWriting(temp_, error);
    if (file_ == nullptr) throwWriteError("creating a temp file", target_, error);
  }
  ~TempFile() {
    if (file_ != nullptr) std::fclose(file_);
    std::error_code ignored;
    if (!committed_) std::filesystem::remove(temp_, ignored);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  std::FILE* stream() const { return file_; }

  void commit() {
    if (std::ferror(file_) != 0) throwWriteError("writing", target_, errnoOr(EIO));
    if (const std::error_code error = platform::flushFileToDisk(file_)) {
      throwWriteError("fsync", target_, error);
    }
    const int rc = std::fclose(file_);
    file_ = nullptr;
    if (rc != 0) throwWriteError("closing", target_, errnoOr(EIO));
    if (const std::error_code error = platform::replaceFile(temp_, target_)) {
      throwWriteError("renaming", target_, error);
    }
    committed_ = true;
    // The rename already happened; this makes it survive a power loss.
    if (const std::error_code error = platform::flushDirectoryToDisk(target_.parent_path())) {
      throwWriteError("syncing its directory", target_, error);
    }
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
