#pragma once
// std::vector whose resize() leaves new elements default-initialised (for float: unwritten)
// instead of zeroing them. For the expert engine's large per-call buffers, which the tasks fill
// completely: zeroing hundreds of MB on the calling thread first would be pure serial overhead.

#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace tandem::experts {

template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}

  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    std::allocator_traits<std::allocator<T>>::construct(static_cast<std::allocator<T>&>(*this), p,
                                                        std::forward<Args>(args)...);
  }
};

template <typename T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace tandem::experts
