#include <windows.h>

#include "engine/core/platform/numa_memory.h"

namespace tandem::platform {

void* allocateOnNumaNode(size_t bytes, int node_id) {
  ULONG highest = 0;
  if (bytes == 0 || node_id < 0 || !GetNumaHighestNodeNumber(&highest) ||
      static_cast<ULONG>(node_id) > highest) {
    return nullptr;
  }
  return VirtualAllocExNuma(GetCurrentProcess(), nullptr, bytes, MEM_RESERVE | MEM_COMMIT,
                            PAGE_READWRITE, static_cast<DWORD>(node_id));
}

// MEM_RELEASE frees the whole reservation and wants size 0.
void freeOnNumaNode(void* data, size_t /*bytes*/) {
  if (data != nullptr) VirtualFree(data, 0, MEM_RELEASE);
}

}  // namespace tandem::platform
