#pragma once
// Where Tandem keeps its files when the user names no place: one data directory (the run store)
// and one cache directory (tokenised datasets, the demo model), resolved the same way everywhere.
//
//   dataDir():  $TANDEM_HOME, else $XDG_DATA_HOME/tandem, else ~/.local/share/tandem
//   cacheDir(): $TANDEM_HOME/cache, else $XDG_CACHE_HOME/tandem, else ~/.cache/tandem
//
// ~ is $HOME, else the home directory the password database has for this user. The XDG variables
// count only when they hold an absolute path: the XDG Base Directory spec says a relative one is
// invalid and must be ignored. Empty variables count as unset. Nothing is created here; callers
// create what they write. Throws tandem::Error, naming what to set, when there is no home at all.

#include <filesystem>
#include <string>

namespace tandem {

// What the resolvers read, as values so tests can state every case. Empty means unset.
struct HomeEnvironment {
  std::string tandem_home;     // $TANDEM_HOME
  std::string xdg_data_home;   // $XDG_DATA_HOME
  std::string xdg_cache_home;  // $XDG_CACHE_HOME
  std::string home;            // $HOME
  std::string passwd_home;     // getpwuid_r(getuid())->pw_dir, looked up only when $HOME is unset

  static HomeEnvironment current();  // this process's environment
};

std::filesystem::path dataDir(const HomeEnvironment& env = HomeEnvironment::current());
std::filesystem::path cacheDir(const HomeEnvironment& env = HomeEnvironment::current());

}  // namespace tandem
