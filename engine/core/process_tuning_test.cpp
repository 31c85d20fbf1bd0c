#include "engine/core/process_tuning.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

namespace tandem {
namespace {

constexpr const char* kReportVariable = "TANDEM_PROCESS_TUNING_REPORT";

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "<unset>";
}

std::string environmentReport(const char* how) {
  return std::string(how) + " " + variable("OMP_WAIT_POLICY") + " " + variable("GOMP_SPINCOUNT");
}

// Run again by tuneOpenMpWaitAndMalloc's restart (this test binary, this test alone): reports the
// environment the new process started with.
TEST(ProcessTuning, ReportsTheRestartedEnvironment) {
  const char* report = std::getenv(kReportVariable);
  if (!report) GTEST_SKIP() << "the restarted process of the tests below";
  std::ofstream(report) << environmentReport("restarted");
}

// A child process sets its environment with `prepare`, then tunes itself as main() does: it either
// restarts into the test above or returns and reports as it is. -> the report.
std::string tuneInAChild(const std::function<void()>& prepare) {
  const std::filesystem::path report =
      std::filesystem::temp_directory_path() / ("tandem_tuning_" + std::to_string(::getpid()));
  std::filesystem::remove(report);
  const pid_t child = ::fork();
  if (child == 0) {
    ::unsetenv("OMP_WAIT_POLICY");
    ::unsetenv("GOMP_SPINCOUNT");
    prepare();
    ::setenv(kReportVariable, report.c_str(), 1);
    std::string filter = "--gtest_filter=ProcessTuning.ReportsTheRestartedEnvironment";
    std::string program = "process_tuning_test";
    char* argv[] = {program.data(), filter.data(), nullptr};
    tuneOpenMpWaitAndMalloc(argv);
    std::ofstream(report) << environmentReport("not-restarted");
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::stringstream text;
  text << std::ifstream(report).rdbuf();
  std::filesystem::remove(report);
  return text.str();
}

// Without the user's settings the program starts itself again once, with libgomp's workers waiting
// passively after a bounded spin (libgomp reads both only when it loads).
TEST(ProcessTuning, RestartsOnceWithABoundedPassiveWait) {
  EXPECT_EQ(tuneInAChild([] {}), "restarted PASSIVE 2000");
}

// Either variable set by the user: theirs wins, no restart, nothing added.
TEST(ProcessTuning, KeepsTheUsersWaitPolicy) {
  EXPECT_EQ(tuneInAChild([] { ::setenv("OMP_WAIT_POLICY", "ACTIVE", 1); }),
            "not-restarted ACTIVE <unset>");
  EXPECT_EQ(tuneInAChild([] { ::setenv("GOMP_SPINCOUNT", "10", 1); }), "not-restarted <unset> 10");
}

}  // namespace
}  // namespace tandem
