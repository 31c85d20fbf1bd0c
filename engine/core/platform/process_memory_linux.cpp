#include <fstream>
#include <sstream>
#include <string>

#include "engine/core/platform/process_memory.h"

namespace tandem::platform {

std::string processNumaMapsText() {
  std::ifstream in("/proc/self/numa_maps");
  if (!in) return {};
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

uint64_t numaNodeReclaimableBytes(int node_id) {
  // Lines read "Node 0 Inactive(file):  123456 kB".
  std::ifstream in("/sys/devices/system/node/node" + std::to_string(node_id) + "/meminfo");
  std::string line;
  uint64_t kib_total = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string node_word, id, key;
    uint64_t kib = 0;
    if (!(fields >> node_word >> id >> key >> kib)) continue;
    if (key == "Inactive(file):" || key == "SReclaimable:") kib_total += kib;
  }
  return kib_total * 1024;
}

}  // namespace tandem::platform
