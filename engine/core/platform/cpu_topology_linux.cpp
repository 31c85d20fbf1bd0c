#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "engine/core/platform/cpu_topology.h"

namespace tandem::platform {

namespace {

std::string readFirstLine(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}

}  // namespace

// Distinct (package, core) pairs.
CpuCoreCounts cpuCoreCounts(const std::vector<int>& cpu_ids) {
  std::set<std::pair<std::string, std::string>> cores;
  std::set<std::string> packages;
  for (int id : cpu_ids) {
    const std::filesystem::path dir = std::filesystem::path("/sys/devices/system/cpu") /
                                      ("cpu" + std::to_string(id)) / "topology";
    const std::string package = readFirstLine(dir / "physical_package_id");
    cores.emplace(package, readFirstLine(dir / "core_id"));
    packages.insert(package);
  }
  CpuCoreCounts counts;
  counts.sockets = std::max<int>(1, static_cast<int>(packages.size()));
  counts.physical_cores = std::max<int>(1, static_cast<int>(cores.size()));
  return counts;
}

}  // namespace tandem::platform
