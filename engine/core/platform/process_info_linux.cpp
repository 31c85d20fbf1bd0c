#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <system_error>

#include "engine/core/platform/process_info.h"

namespace tandem::platform {

int64_t currentProcessId() { return ::getpid(); }

std::string currentUserTag() { return std::to_string(::getuid()); }

std::string hostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

std::string bootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

bool processIsGone(int64_t pid) {
  if (pid <= 0 || pid > INT_MAX) return false;
  // EPERM means the process exists but belongs to another user: alive.
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

std::filesystem::path executablePath() {
  std::error_code ec;
  std::filesystem::path path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : path;
}

}  // namespace tandem::platform
