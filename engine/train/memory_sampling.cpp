#include "engine/train/memory_sampling.h"

#include <utility>

#include "engine/gpu/memory_sample.h"

namespace tandem::train {

MemorySampling::MemorySampling(TrainListener& listener, std::string phase,
                               std::chrono::milliseconds period)
    : listener_(listener),
      phase_(std::move(phase)),
      period_(period),
      thread_([this](std::stop_token stop) { run(stop); }) {}

MemorySampling::~MemorySampling() {
  thread_.request_stop();
  wake_.notify_all();
  thread_.join();
  listener_.onMemory(gpu::sampleMemory(phase_, 0));
}

void MemorySampling::run(std::stop_token stop) {
  while (!stop.stop_requested()) {
    listener_.onMemory(gpu::sampleMemory(phase_, 0));
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, stop, period_, [] { return false; });
  }
}

}  // namespace tandem::train
