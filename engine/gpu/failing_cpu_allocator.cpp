#include "engine/gpu/failing_cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>

namespace tandem::gpu::testing {

namespace {

class FailingCpuAllocator final : public c10::Allocator {
 public:
  explicit FailingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

  void failIn(int n, bool as_host) {
    as_host_ = as_host;
    fail_in_ = n;
  }

  c10::DataPtr allocate(size_t bytes) override {
    const bool fail = fail_in_.load() > 0 && fail_in_.fetch_sub(1) == 1;
    // c10/core/impl/alloc_cpu.cpp's words for a failed host allocation.
    TORCH_CHECK(!fail || !as_host_,
                "DefaultCPUAllocator: not enough memory: you tried to allocate ", bytes, " bytes.");
    TORCH_CHECK_WITH(OutOfMemoryError, !fail, "CPU out of memory. Tried to allocate ", bytes,
                     " bytes\n(more lines of the allocator's report)");
    return inner_->allocate(bytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* inner_;
  std::atomic<int> fail_in_{0};
  std::atomic<bool> as_host_{false};
};

FailingCpuAllocator& allocator() {
  static FailingCpuAllocator* installed = [] {
    auto* a = new FailingCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return *installed;
}

}  // namespace

void installFailingCpuAllocator() { allocator(); }

void failCpuAllocationIn(int n) { allocator().failIn(n, false); }

void failHostAllocationIn(int n) { allocator().failIn(n, true); }

}  // namespace tandem::gpu::testing
