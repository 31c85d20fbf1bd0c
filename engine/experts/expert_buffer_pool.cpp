#include "engine/experts/expert_buffer_pool.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "engine/core/platform/aligned_memory.h"

namespace tandem::experts {

namespace {

// Idle blocks are kept per category, so a work buffer never takes a cache's block (or the
// reverse): each category then holds at most what its own peak needed, as the planner counts it.
struct Pool {
  std::mutex mutex;
  std::vector<ExpertBufferPool::Block> idle[kMemoryCategoryCount];
  int users = 0;
};

// Never destroyed: a layer or cache that outlives main (a static) can still give its block back.
Pool& pool() {
  static Pool* const instance = new Pool;
  return *instance;
}

void chargeIdle(uint64_t bytes) {
  MemoryLedger::global().charge("cpu", MemoryCategory::Cache, bytes);
}
void releaseIdle(uint64_t bytes) {
  MemoryLedger::global().release("cpu", MemoryCategory::Cache, bytes);
}

ExpertBufferPool::Block allocate(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  void* data = platform::allocateAligned(rounded, 64);
  if (!data) throw std::bad_alloc();
  return {data, rounded};
}

// Frees every idle block; the caller holds the mutex.
void freeIdle(Pool& p) {
  for (auto& idle : p.idle) {
    for (const ExpertBufferPool::Block& block : idle) {
      releaseIdle(block.bytes);
      platform::freeAligned(block.data);
    }
    idle.clear();
  }
}

}  // namespace

ExpertBufferPool::Lease::Lease(Block block, MemoryCategory category)
    : block_(block),
      category_(category),
      charge_(MemoryLedger::global(), "cpu", category, block.bytes) {}

ExpertBufferPool::Lease::~Lease() { reset(); }

ExpertBufferPool::Lease::Lease(Lease&& other) noexcept
    : block_(std::exchange(other.block_, Block{})),
      category_(other.category_),
      charge_(std::move(other.charge_)) {}

ExpertBufferPool::Lease& ExpertBufferPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    reset();
    block_ = std::exchange(other.block_, Block{});
    category_ = other.category_;
    charge_ = std::move(other.charge_);
  }
  return *this;
}

void ExpertBufferPool::Lease::reset() {
  if (!block_.data) return;
  charge_.reset();
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  chargeIdle(block_.bytes);
  p.idle[static_cast<int>(category_)].push_back(std::exchange(block_, Block{}));
  // No layer left to reuse it (a cache outlived its layer): free it now.
  if (p.users == 0) freeIdle(p);
}

ExpertBufferPool::User::User() {
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  ++p.users;
}

ExpertBufferPool::User::~User() {
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  if (--p.users == 0) freeIdle(p);
}

ExpertBufferPool::Lease ExpertBufferPool::lease(size_t bytes, MemoryCategory category) {
  Pool& p = pool();
  Block block;
  {
    const std::lock_guard lock(p.mutex);
    std::vector<Block>& idle = p.idle[static_cast<int>(category)];
    auto best = idle.end();
    for (auto it = idle.begin(); it != idle.end(); ++it) {
      const bool fits = it->bytes >= bytes;
      if (best == idle.end()) {
        best = it;
      } else if (fits && (best->bytes < bytes || it->bytes < best->bytes)) {
        best = it;  // the smallest that fits
      } else if (!fits && best->bytes < bytes && it->bytes > best->bytes) {
        best = it;  // none fits so far: the largest, to regrow
      }
    }
    if (best != idle.end()) {
      block = *best;
      idle.erase(best);
      releaseIdle(block.bytes);
    }
  }
  if (block.bytes < bytes) {  // regrow outside the lock: the old contents are not needed
    platform::freeAligned(block.data);
    block = allocate(bytes);
  }
  return Lease(block, category);
}

uint64_t ExpertBufferPool::idleBytes() {
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  uint64_t bytes = 0;
  for (const auto& idle : p.idle)
    for (const Block& block : idle) bytes += block.bytes;
  return bytes;
}

}  // namespace tandem::experts
