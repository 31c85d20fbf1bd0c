#include "engine/core/paths.h"

#include "engine/core/error.h"
#include "engine/core/platform/environment.h"
#include "engine/core/platform/user_dirs.h"

namespace tandem {

namespace {

namespace fs = std::filesystem;

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
  env.tandem_home = platform::environmentVariable("TANDEM_HOME");
  env.xdg_data_home = platform::environmentVariable("XDG_DATA_HOME");
  env.xdg_cache_home = platform::environmentVariable("XDG_CACHE_HOME");
  env.home = platform::environmentVariable("HOME");
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
