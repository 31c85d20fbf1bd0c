#include <windows.h>

#include "engine/core/platform/system_memory.h"

namespace tandem::platform {

SystemMemoryBytes systemMemoryBytes() {
  SystemMemoryBytes m;
  MEMORYSTATUSEX status = {};
  status.dwLength = sizeof status;
  if (GlobalMemoryStatusEx(&status)) {
    m.total_bytes = status.ullTotalPhys;
    m.free_bytes = status.ullAvailPhys;
  }
  return m;
}

}  // namespace tandem::platform
