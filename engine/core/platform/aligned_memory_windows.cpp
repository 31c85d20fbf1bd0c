#include <malloc.h>

#include "engine/core/platform/aligned_memory.h"

namespace tandem::platform {

void* allocateAligned(size_t bytes, size_t alignment) {
  return _aligned_malloc((bytes + alignment - 1) / alignment * alignment, alignment);
}

void freeAligned(void* data) noexcept { _aligned_free(data); }

}  // namespace tandem::platform
