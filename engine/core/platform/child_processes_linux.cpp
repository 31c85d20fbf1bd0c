#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "engine/core/error.h"
#include "engine/core/platform/child_processes.h"

extern char** environ;

namespace tandem::platform {

std::vector<std::string> processEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  return env;
}

int64_t spawnSelf(const std::vector<std::string>& args, const std::vector<std::string>& env,
                  int64_t group, const std::string& what) {
  std::vector<std::string> arg_copy = args, env_copy = env;
  std::vector<char*> argv, envp;
  for (std::string& a : arg_copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env_copy) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, static_cast<pid_t>(group));
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw Error("cannot start " + what + ": " + std::strerror(rc));
  return pid;
}

std::optional<ChildExit> reapEndedChild() {
  int status = 0;
  const pid_t done = waitpid(-1, &status, WNOHANG);
  if (done <= 0) return std::nullopt;
  ChildExit exit;
  exit.pid = done;
  exit.exit_code = WIFEXITED(status)     ? WEXITSTATUS(status)
                   : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                         : 1;
  return exit;
}

void interruptProcess(int64_t pid) { kill(static_cast<pid_t>(pid), SIGINT); }
void killProcess(int64_t pid) { kill(static_cast<pid_t>(pid), SIGKILL); }

}  // namespace tandem::platform
