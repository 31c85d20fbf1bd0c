#pragma once
// Heap memory with a chosen alignment, released with its own free. Linux: std::aligned_alloc +
// std::free. Windows: _aligned_malloc + _aligned_free (its C runtime has no aligned_alloc, and
// memory from _aligned_malloc must not go to free()).

#include <cstddef>

namespace tandem::platform {

// `bytes` rounded up to a multiple of `alignment` (a power of two); nullptr when out of memory.
void* allocateAligned(size_t bytes, size_t alignment);

// Frees what allocateAligned returned; nullptr is allowed.
void freeAligned(void* data) noexcept;

}  // namespace tandem::platform
