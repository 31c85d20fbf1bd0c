#include <sys/sysinfo.h>

#include <fstream>
#include <string>

#include "engine/core/platform/system_memory.h"

namespace tandem::platform {

namespace {

uint64_t reclaimableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0, free_kib = 0, available_kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemFree:") free_kib = kib;
    if (key == "MemAvailable:") available_kib = kib;
  }
  return available_kib > free_kib ? (available_kib - free_kib) * 1024 : 0;
}

}  // namespace

SystemMemoryBytes systemMemoryBytes() {
  SystemMemoryBytes m;
  struct sysinfo info = {};
  if (sysinfo(&info) == 0) {
    m.total_bytes = static_cast<uint64_t>(info.totalram) * info.mem_unit;
    m.free_bytes = static_cast<uint64_t>(info.freeram) * info.mem_unit;
    m.buffer_bytes = static_cast<uint64_t>(info.bufferram) * info.mem_unit;
  }
  m.reclaimable_bytes = reclaimableBytes();
  return m;
}

}  // namespace tandem::platform
