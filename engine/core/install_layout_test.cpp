#include "engine/core/install_layout.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "engine/core/error.h"
#include "engine/core/platform/process_info.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

class InstallLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = fs::temp_directory_path() /
              ("tandem_layout_" + std::to_string(platform::currentProcessId()));
    fs::create_directories(prefix_ / "bin");
    fs::create_directories(prefix_ / "share" / "tandem" / "resources");
    fs::create_directories(prefix_ / "share" / "tandem" / "presets");
  }
  void TearDown() override { fs::remove_all(prefix_); }

  InstallEnvironment installed() const {
    InstallEnvironment env;
    env.executable = prefix_ / "bin" / "tandem";
    return env;
  }

  fs::path prefix_;
};

TEST_F(InstallLayoutTest, FindsSharedFoldersNextToTheProgram) {
  EXPECT_EQ(resourcesDir(installed()), prefix_ / "share" / "tandem" / "resources");
  EXPECT_EQ(presetsDir(installed()), prefix_ / "share" / "tandem" / "presets");
}

TEST_F(InstallLayoutTest, EnvironmentOverridesWin) {
  InstallEnvironment env = installed();
  env.presets_override = (prefix_ / "bin").string();
  EXPECT_EQ(presetsDir(env), prefix_ / "bin");
  EXPECT_EQ(resourcesDir(env), prefix_ / "share" / "tandem" / "resources");
}

TEST_F(InstallLayoutTest, MissingFolderNamesTheVariableToSet) {
  fs::remove_all(prefix_ / "share" / "tandem" / "presets");
  try {
    presetsDir(installed());
    FAIL() << "a missing presets folder must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("presets"), std::string::npos) << e.what();
    EXPECT_NE(e.whatToDo().find("TANDEM_PRESETS"), std::string::npos) << e.whatToDo();
  }
  InstallEnvironment env = installed();
  env.resources_override = (prefix_ / "nowhere").string();
  EXPECT_THROW(resourcesDir(env), Error);
}

TEST(InstallLayout, TheCurrentEnvironmentIsThisProgram) {
  const InstallEnvironment env = InstallEnvironment::current();
  ASSERT_TRUE(env.executable.is_absolute()) << env.executable;
  EXPECT_EQ(env.executable.stem(), "core_paths_test");
}

}  // namespace
}  // namespace tandem
