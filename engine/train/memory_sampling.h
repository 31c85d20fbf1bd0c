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

}  // namespace tandem::train
