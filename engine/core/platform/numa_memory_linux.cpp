#include <numa.h>

#include "engine/core/platform/numa_memory.h"

namespace tandem::platform {

void* allocateOnNumaNode(size_t bytes, int node_id) {
  if (bytes == 0 || node_id < 0 || numa_available() < 0 || node_id > numa_max_node()) {
    return nullptr;
  }
  return numa_alloc_onnode(bytes, node_id);
}

void freeOnNumaNode(void* data, size_t bytes) {
  if (data != nullptr) numa_free(data, bytes);
}

}  // namespace tandem::platform
