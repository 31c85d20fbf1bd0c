#pragma once
// The machine's RAM as the OS reports it. Linux: sysinfo(2) and /proc/meminfo. Windows:
// GlobalMemoryStatusEx.

#include <cstdint>

namespace tandem::platform {

struct SystemMemoryBytes {
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  // Page cache and other memory the OS gives back on demand (a model's mapped weights sit there),
  // which free_bytes leaves out. Linux: MemAvailable less MemFree. Windows: 0, since its
  // available figure already counts the standby list.
  uint64_t reclaimable_bytes = 0;
  // Linux: sysinfo's buffer memory (part of what `tandem info` calls available). Windows: 0.
  uint64_t buffer_bytes = 0;
};

// All zero when the OS does not answer.
SystemMemoryBytes systemMemoryBytes();

}  // namespace tandem::platform
