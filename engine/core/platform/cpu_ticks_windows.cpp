#include <windows.h>

#include "engine/core/platform/cpu_ticks.h"

namespace tandem::platform {

std::vector<CpuTicks> cpuTicks() {
  FILETIME idle, kernel, user;
  if (!GetSystemTimes(&idle, &kernel, &user)) return {};
  auto ticks = [](const FILETIME& t) {
    return (static_cast<uint64_t>(t.dwHighDateTime) << 32) | t.dwLowDateTime;
  };
  // Kernel time includes the idle time.
  CpuTicks t;
  t.total = ticks(kernel) + ticks(user);
  t.busy = t.total - ticks(idle);
  return {t};
}

}  // namespace tandem::platform
