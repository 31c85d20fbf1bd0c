#include "engine/experts/expert_forward_cache.h"

#include <cstring>

namespace tandem::experts {

namespace {
template <typename Vector>
uint64_t byteSize(const Vector& v) {
  return v.capacity() * sizeof(typename Vector::value_type);
}
}  // namespace

void ExpertForwardCache::release() {
  // swap-with-empty frees the vectors (clear() would keep the capacity) and gives the block back.
  ExpertForwardCache empty;
  std::swap(*this, empty);
}

bool ExpertForwardCache::cachedInputIs(const void* x, size_t x_bytes) const {
  return state_ == State::Cached && x_bytes == x_bytes_ &&
         (x_bytes == 0 || std::memcmp(x, x_, x_bytes) == 0);
}

void ExpertForwardCache::chargeLedger() {
  const uint64_t bytes = byteSize(weights_) + byteSize(routing_.offsets) +
                         byteSize(routing_.slot_of_pos) + byteSize(routing_.pos_of_slot);
  charge_ = MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Activations, bytes);
}

std::string_view cacheStateName(ExpertForwardCache::State state) {
  switch (state) {
    case ExpertForwardCache::State::Empty: return "empty";
    case ExpertForwardCache::State::Cached: return "cached";
    case ExpertForwardCache::State::Consumed: return "consumed";
  }
  return "?";
}

}  // namespace tandem::experts
