#include <cstdlib>

#include "engine/core/platform/aligned_memory.h"

namespace tandem::platform {

void* allocateAligned(size_t bytes, size_t alignment) {
  return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
}

void freeAligned(void* data) noexcept { std::free(data); }

}  // namespace tandem::platform
