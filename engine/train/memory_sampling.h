#pragma once
// Samples the memory (gpu/memory_sample.h) every `period` on its own thread while it lives, and
// hands each snapshot to a listener: how the memory map moves during a model load, which runs
// as one long call. The first sample is taken at once, the last when it is destroyed.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "engine/core/train_events.h"

namespace tandem::train {

class MemorySampling {
 public:
  // `listener.onMemory` must be thread-safe (train_events.h) and outlive this object.
  MemorySampling(TrainListener& listener, std::string phase,
                 std::chrono::milliseconds period = std::chrono::milliseconds(250));
  ~MemorySampling();  // stops the thread, then takes the last sample on the caller's thread
  MemorySampling(const MemorySampling&) = delete;
  MemorySampling& operator=(const MemorySampling&) = delete;

 private:
  void run(std::stop_token stop);

  TrainListener& listener_;
  std::string phase_;
  std::chrono::milliseconds period_;
  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::jthread thread_;  // last: started once the members it reads exist
};

// The after-step snapshots of a run, kept to about 5% of its time: a sample that took t waits
// 20·t before the next one (reading numa_maps walks the page tables of every byte the process
// holds, which for a terabyte of experts is not free). The first step and the last are always
// sampled.
class StepMemorySampler {
 public:
  void afterStep(TrainListener& listener, int64_t step, bool first_or_last);

 private:
  std::chrono::steady_clock::time_point next_{};
};

}  // namespace tandem::train
