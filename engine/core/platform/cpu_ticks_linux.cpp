#include <cstdio>
#include <cstring>

#include "engine/core/platform/cpu_ticks.h"

namespace tandem::platform {

std::vector<CpuTicks> cpuTicks() {
  std::vector<CpuTicks> out;
  std::FILE* in = std::fopen("/proc/stat", "r");
  if (in == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof line, in) != nullptr) {
    if (std::strncmp(line, "cpu", 3) != 0 || line[3] < '0' || line[3] > '9') continue;
    int cpu = 0;
    unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0,
                       steal = 0;
    const int n = std::sscanf(line, "cpu%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &user,
                              &nice, &system, &idle, &iowait, &irq, &softirq, &steal);
    if (n < 5) continue;
    CpuTicks t;
    t.cpu = cpu;
    t.busy = user + nice + system + irq + softirq + steal;
    t.total = t.busy + idle + iowait;
    out.push_back(t);
  }
  std::fclose(in);
  return out;
}

}  // namespace tandem::platform
