#pragma once
// Children running this same program (`tandem launch`'s ranks). Linux: posix_spawn of
// /proc/self/exe into a process group (so a terminal's Ctrl-C reaches the launcher alone, which
// passes it on once), waitpid, kill. Windows: not available (spawnSelf throws Error).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::platform {

// This process's environment, "NAME=value" each.
std::vector<std::string> processEnvironment();

// Starts this program with `args` (args[0]: the name it sees) and environment `env`, in process
// group `group` (0: a new group led by the child). Throws Error naming `what` when it cannot.
int64_t spawnSelf(const std::vector<std::string>& args, const std::vector<std::string>& env,
                  int64_t group, const std::string& what);

struct ChildExit {
  int64_t pid = 0;
  int exit_code = 0;  // 128 + the signal's number for a child a signal ended
};
// A child that has ended, without waiting; nullopt while none has.
std::optional<ChildExit> reapEndedChild();

void interruptProcess(int64_t pid);  // as Ctrl-C in its terminal would (SIGINT)
void killProcess(int64_t pid);       // at once (SIGKILL)

}  // namespace tandem::platform
