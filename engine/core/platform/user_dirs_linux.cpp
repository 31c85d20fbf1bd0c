#include <pwd.h>
#include <unistd.h>

#include <vector>

#include "engine/core/platform/user_dirs.h"

namespace tandem::platform {

std::filesystem::path accountHomeDir() {
  const long hint = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(hint > 0 ? static_cast<size_t>(hint) : 16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(getuid(), &pw, buf.data(), buf.size(), &found) != 0 || !found || !found->pw_dir) {
    return {};
  }
  return found->pw_dir;
}

}  // namespace tandem::platform
