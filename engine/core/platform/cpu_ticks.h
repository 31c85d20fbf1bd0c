#pragma once
// How long each logical CPU has been busy and in total since boot, in the OS's ticks, for CPU
// utilisation over an interval (engine/core/system_load.h). Linux: /proc/stat's cpuN lines (busy =
// user + nice + system + irq + softirq + steal; total adds idle and iowait). Windows:
// GetSystemTimes, the whole machine as one entry with cpu -1.

#include <cstdint>
#include <vector>

namespace tandem::platform {

struct CpuTicks {
  int cpu = -1;  // logical CPU id; -1: the whole machine
  uint64_t busy = 0;
  uint64_t total = 0;
};

// Empty when the OS does not answer.
std::vector<CpuTicks> cpuTicks();

}  // namespace tandem::platform
