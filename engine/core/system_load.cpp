#include "engine/core/system_load.h"

#include <algorithm>
#include <map>

#include "engine/core/numa.h"

namespace tandem {

CpuLoadMeter::CpuLoadMeter() : last_(platform::cpuTicks()) {}

std::vector<NodeLoad> CpuLoadMeter::sample() {
  std::vector<platform::CpuTicks> now = platform::cpuTicks();
  std::map<int, platform::CpuTicks> before;
  for (const platform::CpuTicks& t : last_) before[t.cpu] = t;
  std::map<int, std::pair<uint64_t, uint64_t>> delta;  // cpu -> (busy, total) since the last sample
  for (const platform::CpuTicks& t : now) {
    auto it = before.find(t.cpu);
    if (it == before.end() || t.total < it->second.total || t.busy < it->second.busy) continue;
    delta[t.cpu] = {t.busy - it->second.busy, t.total - it->second.total};
  }
  last_ = std::move(now);
  auto percent = [](uint64_t busy, uint64_t total) {
    return total == 0 ? 0.0 : std::clamp(100.0 * busy / total, 0.0, 100.0);
  };
  if (delta.count(-1) != 0) return {{0, percent(delta[-1].first, delta[-1].second)}};
  std::vector<NodeLoad> out;
  for (const NumaNode& node : detectNumaTopology().nodes) {
    uint64_t busy = 0, total = 0;
    for (int cpu : node.cpus) {
      auto it = delta.find(cpu);
      if (it == delta.end()) continue;
      busy += it->second.first;
      total += it->second.second;
    }
    out.push_back({node.id, percent(busy, total)});
  }
  return out;
}

}  // namespace tandem
