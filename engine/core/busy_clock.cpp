#include "engine/core/busy_clock.h"

namespace tandem {

std::atomic<int64_t>& BusyClock::counter(BusyResource resource) {
  static std::atomic<int64_t> counters[static_cast<int>(BusyResource::kCount)];
  return counters[static_cast<int>(resource)];
}

void BusyClock::add(BusyResource resource, int64_t ns) {
  counter(resource).fetch_add(ns, std::memory_order_relaxed);
}

double BusyClock::totalMs(BusyResource resource) {
  return static_cast<double>(counter(resource).load(std::memory_order_relaxed)) / 1e6;
}

}  // namespace tandem
