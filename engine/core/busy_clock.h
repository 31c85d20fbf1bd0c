#pragma once
// How long a resource was busy, summed over a process: the e2e bench's per-step trace (issue 28)
// reads it around a step. ExpertEngine is the wall time inside the CPU expert engine's forward and
// backward calls (ExpertLayer), counted by a ScopedBusyTime there; two clock reads per call, so it
// is always on. Thread-safe.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tandem {

enum class BusyResource { ExpertEngine, kCount };

class BusyClock {
 public:
  static void add(BusyResource resource, int64_t ns);
  static double totalMs(BusyResource resource);

 private:
  static std::atomic<int64_t>& counter(BusyResource resource);
};

class ScopedBusyTime {
 public:
  explicit ScopedBusyTime(BusyResource resource)
      : resource_(resource), start_(std::chrono::steady_clock::now()) {}
  ~ScopedBusyTime() {
    BusyClock::add(resource_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - start_)
                                  .count());
  }
  ScopedBusyTime(const ScopedBusyTime&) = delete;
  ScopedBusyTime& operator=(const ScopedBusyTime&) = delete;

 private:
  BusyResource resource_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tandem
