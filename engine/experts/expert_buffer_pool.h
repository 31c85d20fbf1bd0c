#pragma once
// The large buffers of the expert layers (a forward's per-pair outputs, a backward's dx pairs, a
// forward cache's g / u / x), leased from one process-wide pool and given back after use instead
// of being allocated per call. A fresh 100 MB buffer costs its page faults and their zero-fill on
// every call (at 2048 tokens about as long as the GEMMs themselves), and with many threads the
// faults also contend on the process's memory-map lock. After warm-up nothing is allocated.
//
// The pool is shared by every layer: layers run one after the other, so a training step holds as
// many blocks as it has live caches plus one work buffer, the same as per-call allocation did at
// its peak (gradient checkpointing: one cache, so one cache block, whatever the layer count).
//
// Ledger (MemoryLedger::global(), device "cpu"): a leased block is charged to its holder's
// category (Activations for a forward cache, Scratch for a call's work buffers); an idle block,
// kept for the next call, to Cache. Idle blocks are freed when the last ExpertLayer is destroyed
// (ExpertBufferPool::User). Thread-safe: concurrent calls lease different blocks.

#include <cstddef>
#include <cstdint>

#include "engine/core/memory_ledger.h"

namespace tandem::experts {

class ExpertBufferPool {
 public:
  struct Block {
    void* data = nullptr;  // 64-byte aligned, contents undefined
    size_t bytes = 0;
  };

  // A block of at least `bytes`, charged to `category` until the lease ends. Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Block block, MemoryCategory category);
    ~Lease();
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    template <typename T>
    T* as() const {
      return static_cast<T*>(block_.data);
    }
    uint64_t bytes() const { return block_.bytes; }
    void reset();  // gives the block back to the pool

   private:
    Block block_;
    MemoryCategory category_ = MemoryCategory::Scratch;
    MemoryCharge charge_;
  };

  // Held by each ExpertLayer: when the last one goes, the idle blocks are freed.
  class User {
   public:
    User();
    ~User();
    User(const User&) = delete;
    User& operator=(const User&) = delete;
  };

  // Of the idle blocks last leased for `category`: the smallest that fits, else the largest
  // regrown, else a new one.
  static Lease lease(size_t bytes, MemoryCategory category);
  static uint64_t idleBytes();
};

}  // namespace tandem::experts
