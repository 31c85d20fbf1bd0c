#include "engine/core/host_memory.h"

#include <algorithm>
#include <charconv>

#include "engine/core/numa.h"
#include "engine/core/platform/process_memory.h"
#include "engine/core/platform/system_memory.h"

namespace tandem {

namespace {

bool parseUnsigned(std::string_view text, uint64_t& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

// One mapping's line: "7f… default file=/x mapped=3 N0=2 N1=1 kernelpagesize_kB=4".
void addMapping(std::string_view line, std::map<int, uint64_t>& bytes_by_node) {
  std::map<int, uint64_t> pages_by_node;
  uint64_t page_kib = 4;
  size_t pos = 0;
  while (pos < line.size()) {
    size_t end = line.find(' ', pos);
    if (end == std::string_view::npos) end = line.size();
    const std::string_view field = line.substr(pos, end - pos);
    pos = end + 1;
    const size_t eq = field.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    uint64_t number = 0;
    if (!parseUnsigned(value, number)) continue;
    if (key == "kernelpagesize_kB") {
      page_kib = number;
    } else if (key.size() > 1 && key[0] == 'N') {
      uint64_t node = 0;
      if (parseUnsigned(key.substr(1), node)) pages_by_node[static_cast<int>(node)] += number;
    }
  }
  for (const auto& [node, pages] : pages_by_node) bytes_by_node[node] += pages * page_kib * 1024;
}

}  // namespace

std::map<int, uint64_t> numaMapsBytesPerNode(std::string_view numa_maps) {
  std::map<int, uint64_t> bytes_by_node;
  size_t pos = 0;
  while (pos < numa_maps.size()) {
    size_t end = numa_maps.find('\n', pos);
    if (end == std::string_view::npos) end = numa_maps.size();
    addMapping(numa_maps.substr(pos, end - pos), bytes_by_node);
    pos = end + 1;
  }
  return bytes_by_node;
}

std::vector<HostNodeMemory> hostNodeMemory() {
  const NumaTopology topology = detectNumaTopology();
  const std::string numa_maps = platform::processNumaMapsText();
  const std::map<int, uint64_t> process = numaMapsBytesPerNode(numa_maps);
  std::vector<HostNodeMemory> nodes;
  for (const NumaNode& n : topology.nodes) {
    HostNodeMemory node;
    node.node = n.id;
    node.total_bytes = n.total_bytes;
    if (topology.nodes.size() == 1) {
      // The whole machine: MemAvailable, the kernel's own estimate.
      const platform::SystemMemoryBytes system = platform::systemMemoryBytes();
      node.available_bytes = system.free_bytes + system.reclaimable_bytes;
    } else {
      node.available_bytes = n.free_bytes + platform::numaNodeReclaimableBytes(n.id);
    }
    node.available_bytes = std::min(node.available_bytes, node.total_bytes);
    node.process_bytes_known = !numa_maps.empty();
    if (topology.nodes.size() == 1) {
      // Without NUMA every page of the process is on the one node, whatever numa_maps numbers it.
      for (const auto& [id, bytes] : process) node.process_bytes += bytes;
    } else if (auto it = process.find(n.id); it != process.end()) {
      node.process_bytes = it->second;
    }
    nodes.push_back(node);
  }
  return nodes;
}

}  // namespace tandem
