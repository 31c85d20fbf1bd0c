#pragma once
// ExpertForwardCache: what one training forward of an ExpertLayer keeps for its backward.
//
// An explicit state machine, never a ring that silently wraps:
//   Empty ──forward(cache)──► Cached ──backward──► Consumed
//     ▲                                               │
//     └──────────────── release() (any state) ◄───────┘
// backward() needs Cached and throws otherwise. forward() into a Cached cache throws too (its
// activations would be lost); release() first. Gradient checkpointing is release() after the
// forward, a second forward(cache) before backward: same inputs give the same gradients.
// The bytes it holds are charged to MemoryLedger::global() as ("cpu", Activations); its large
// buffers (g, u, x) are one block leased from ExpertBufferPool, so a training loop reuses them.

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/experts/expert_buffer_pool.h"
#include "engine/experts/expert_routing.h"
#include "engine/experts/expert_types.h"

namespace tandem::experts {

class ExpertLayer;

class ExpertForwardCache {
 public:
  enum class State { Empty, Cached, Consumed };

  ExpertForwardCache() = default;
  ExpertForwardCache(ExpertForwardCache&&) noexcept = default;
  ExpertForwardCache& operator=(ExpertForwardCache&&) noexcept = default;
  ExpertForwardCache(const ExpertForwardCache&) = delete;
  ExpertForwardCache& operator=(const ExpertForwardCache&) = delete;

  State state() const { return state_; }
  uint64_t bytes() const { return charge_.bytes() + block_.bytes(); }
  void release();  // frees everything, back to Empty
  // Cached from a forward whose input x was exactly these bytes: what a recomputation checks
  // before it reuses this cache instead of running the experts again (model::KeptExpertForward).
  bool cachedInputIs(const void* x, size_t x_bytes) const;

 private:
  friend class ExpertLayer;
  void chargeLedger();  // charges what the vectors now hold (the block charges itself)

  State state_ = State::Empty;
  const ExpertLayer* owner_ = nullptr;  // backward must come from the layer that ran forward
  ActivationType act_type_ = ActivationType::F32;
  ExpertRouting routing_;
  std::vector<float> weights_;     // [T, k] routing weights
  ExpertBufferPool::Lease block_;  // holds gate_, up_, lora_z_, x_
  // [P, I] pre-activations g and u, in routing (expert-sorted) order; with several NUMA nodes
  // node-major (node k's [P, i1_k - i0_k] at P · i0_k). backward overwrites them in place with dg
  // and du, which is why a cache is good for exactly one backward.
  float* gate_ = nullptr;
  float* up_ = nullptr;
  // [nodes][P, 3r] s · x A_gateᵀ | s · x A_upᵀ | s · h A_downᵀ from the forward (slots of
  // projections LoRA does not target unwritten; down's is each node's part), for the LoRA
  // gradients; nullptr when LoRA targets nothing.
  float* lora_z_ = nullptr;
  unsigned char* x_ = nullptr;  // [T, H] the forward input, in its own activation type
  size_t x_bytes_ = 0;
  MemoryCharge charge_;
};

std::string_view cacheStateName(ExpertForwardCache::State state);

}  // namespace tandem::experts
