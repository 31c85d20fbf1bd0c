#include "engine/core/error.h"
#include "engine/core/platform/child_processes.h"

namespace tandem::platform {

std::vector<std::string> processEnvironment() { return {}; }

int64_t spawnSelf(const std::vector<std::string>&, const std::vector<std::string>&, int64_t,
                  const std::string& what) {
  throw Error("cannot start " + what + ": `tandem launch` runs on Linux",
              "start each rank with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set");
}

std::optional<ChildExit> reapEndedChild() { return std::nullopt; }
void interruptProcess(int64_t) {}
void killProcess(int64_t) {}

}  // namespace tandem::platform
