#include "engine/core/error.h"
#include "engine/core/platform/tcp_listen.h"

namespace tandem::platform {

int listenTcp(const std::string& address, int port) {
  throw Error("a data-parallel job cannot listen on " + address + ":" + std::to_string(port) +
                  " on Windows: Tandem's multi-machine training runs on Linux",
              "run the job's ranks on Linux machines");
}

std::string localAddressTowards(const std::string&, int) { return {}; }

}  // namespace tandem::platform
