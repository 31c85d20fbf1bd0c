#include "engine/core/paths.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "engine/core/error.h"
#include "engine/core/platform/environment.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

HomeEnvironment withHome(std::string home) {
  HomeEnvironment env;
  env.home = std::move(home);
  return env;
}

TEST(Paths, TandemHomeHoldsDataAndCacheAndWinsOverEverything) {
  HomeEnvironment env = withHome("/home/me");
  env.tandem_home = "/srv/tandem";
  env.xdg_data_home = "/x/data";
  env.xdg_cache_home = "/x/cache";
  EXPECT_EQ(dataDir(env), fs::path("/srv/tandem"));
  EXPECT_EQ(cacheDir(env), fs::path("/srv/tandem/cache"));
}

TEST(Paths, AbsoluteXdgDirectories) {
  HomeEnvironment env = withHome("/home/me");
  env.xdg_data_home = "/x/data";
  env.xdg_cache_home = "/x/cache";
  EXPECT_EQ(dataDir(env), fs::path("/x/data/tandem"));
  EXPECT_EQ(cacheDir(env), fs::path("/x/cache/tandem"));
}

// The XDG Base Directory spec: relative paths in these variables are invalid and ignored.
TEST(Paths, RelativeXdgDirectoriesAreIgnored) {
  HomeEnvironment env = withHome("/home/me");
  env.xdg_data_home = "data";
  env.xdg_cache_home = "./cache";
  EXPECT_EQ(dataDir(env), fs::path("/home/me/.local/share/tandem"));
  EXPECT_EQ(cacheDir(env), fs::path("/home/me/.cache/tandem"));
}

TEST(Paths, HomeThenPasswordDatabase) {
  EXPECT_EQ(dataDir(withHome("/home/me")), fs::path("/home/me/.local/share/tandem"));
  EXPECT_EQ(cacheDir(withHome("/home/me")), fs::path("/home/me/.cache/tandem"));
  HomeEnvironment env;
  env.passwd_home = "/var/lib/me";
  EXPECT_EQ(dataDir(env), fs::path("/var/lib/me/.local/share/tandem"));
  EXPECT_EQ(cacheDir(env), fs::path("/var/lib/me/.cache/tandem"));
}

TEST(Paths, NoHomeAtAllIsAnErrorThatSaysWhatToSet) {
  HomeEnvironment env;
  env.xdg_cache_home = "relative";
  try {
    cacheDir(env);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("XDG_CACHE_HOME"), std::string::npos) << e.message();
    EXPECT_NE(e.whatToDo().find("TANDEM_HOME"), std::string::npos) << e.whatToDo();
  }
  EXPECT_THROW(dataDir(env), Error);
  env.tandem_home = "/srv/tandem";  // TANDEM_HOME alone is enough
  EXPECT_EQ(dataDir(env), fs::path("/srv/tandem"));
}

// The same through the process environment, restored afterwards.
class PathsFromEnvironment : public ::testing::Test {
 protected:
  static constexpr const char* kNames[] = {"TANDEM_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME",
                                           "HOME"};

  void SetUp() override {
    for (int i = 0; i < 4; ++i) {
      const char* value = std::getenv(kNames[i]);
      saved_[i] = value ? std::optional<std::string>(value) : std::nullopt;
      platform::unsetEnvironmentVariable(kNames[i]);
    }
  }
  void TearDown() override {
    for (int i = 0; i < 4; ++i) {
      saved_[i] ? platform::setEnvironmentVariable(kNames[i], saved_[i]->c_str())
                : platform::unsetEnvironmentVariable(kNames[i]);
    }
  }

  std::optional<std::string> saved_[4];
};

TEST_F(PathsFromEnvironment, VariablesOverrideInOrder) {
  platform::setEnvironmentVariable("HOME", "/home/me");
  EXPECT_EQ(dataDir(), fs::path("/home/me/.local/share/tandem"));
  EXPECT_EQ(cacheDir(), fs::path("/home/me/.cache/tandem"));
  platform::setEnvironmentVariable("XDG_DATA_HOME", "/x/data");
  platform::setEnvironmentVariable("XDG_CACHE_HOME", "/x/cache");
  EXPECT_EQ(dataDir(), fs::path("/x/data/tandem"));
  EXPECT_EQ(cacheDir(), fs::path("/x/cache/tandem"));
  platform::setEnvironmentVariable("TANDEM_HOME", "/srv/tandem");
  EXPECT_EQ(dataDir(), fs::path("/srv/tandem"));
  EXPECT_EQ(cacheDir(), fs::path("/srv/tandem/cache"));
  platform::setEnvironmentVariable("TANDEM_HOME", "");  // empty counts as unset
  EXPECT_EQ(dataDir(), fs::path("/x/data/tandem"));
}

TEST_F(PathsFromEnvironment, WithoutHomeThePasswordDatabaseIsAsked) {
  EXPECT_TRUE(HomeEnvironment::current().home.empty());
  const std::string passwd_home = HomeEnvironment::current().passwd_home;
  if (passwd_home.empty()) GTEST_SKIP() << "this user has no home in the password database";
  EXPECT_EQ(cacheDir(), fs::path(passwd_home) / ".cache" / "tandem");
  platform::setEnvironmentVariable("HOME", "/home/me");
  EXPECT_TRUE(HomeEnvironment::current().passwd_home.empty());  // not looked up when not needed
}

}  // namespace
}  // namespace tandem
