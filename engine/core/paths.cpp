#include "engine/core/paths.h"

#include <cstdlib>

#include "engine/core/error.h"
#include "engine/core/platform/user_dirs.h"

namespace tandem {

namespace {

namespace fs = std::filesystem;

std::string envOrEmpty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// $HOME, else the password database's home; `what` names the directory for the error.
fs::path userHome(const HomeEnvironment& env, const char* what, const char* xdg_variable) {
  if (!env.home.empty()) return env.home;
  if (!env.passwd_home.empty()) return env.passwd_home;
  const std::string xdg(xdg_variable);
  throw Error("cannot find a place for Tandem's " + std::string(what) +
                  " files: TANDEM_HOME and HOME are unset, " + xdg +
                  " is unset or not an absolute path, and the password database has no home "
                  "directory for this user",
              "set TANDEM_HOME (or " + xdg + ", or HOME) to a directory");
}

// The XDG spec: "If an implementation encounters a relative path in any of these variables it
// should consider the path invalid and ignore it."
bool usableXdg(const std::string& value) { return !value.empty() && value.front() == '/'; }

}  // namespace

HomeEnvironment HomeEnvironment::current() {
  HomeEnvironment env;
  env.tandem_home = envOrEmpty("TANDEM_HOME");
  env.xdg_data_home = envOrEmpty("XDG_DATA_HOME");
  env.xdg_cache_home = envOrEmpty("XDG_CACHE_HOME");
  env.home = envOrEmpty("HOME");
  if (env.home.empty()) env.passwd_home = platform::accountHomeDir().string();
  return env;
}

fs::path dataDir(const HomeEnvironment& env) {
  if (!env.tandem_home.empty()) return env.tandem_home;
  if (usableXdg(env.xdg_data_home)) return fs::path(env.xdg_data_home) / "tandem";
  return userHome(env, "data", "XDG_DATA_HOME") / ".local" / "share" / "tandem";
}

fs::path cacheDir(const HomeEnvironment& env) {
  if (!env.tandem_home.empty()) return fs::path(env.tandem_home) / "cache";
  if (usableXdg(env.xdg_cache_home)) return fs::path(env.xdg_cache_home) / "tandem";
  return userHome(env, "cache", "XDG_CACHE_HOME") / ".cache" / "tandem";
}

}  // namespace tandem
