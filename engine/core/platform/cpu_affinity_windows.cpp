#include <windows.h>

#include "engine/core/platform/cpu_affinity.h"

namespace tandem::platform {

std::vector<int> allowedCpuIds() {
  std::vector<int> cpus;
  DWORD_PTR process_mask = 0, system_mask = 0;
  if (!GetProcessAffinityMask(GetCurrentProcess(), &process_mask, &system_mask)) return cpus;
  for (int cpu = 0; cpu < static_cast<int>(8 * sizeof(DWORD_PTR)); ++cpu) {
    if ((process_mask >> cpu) & 1u) cpus.push_back(cpu);
  }
  return cpus;
}

bool pinCurrentThreadToCpu(int cpu_id) {
  if (cpu_id < 0 || cpu_id >= static_cast<int>(8 * sizeof(DWORD_PTR))) return false;
  return SetThreadAffinityMask(GetCurrentThread(), DWORD_PTR{1} << cpu_id) != 0;
}

}  // namespace tandem::platform
