#include "engine/train/memory_sampling.h"

#include <utility>

#include "engine/core/log.h"
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
  try {
    listener_.onMemory(gpu::sampleMemory(phase_, 0));
  } catch (const std::exception& e) {
    logWarn() << "memory sample: " << e.what();  // the map misses one reading, nothing else
  }
}

void MemorySampling::run(std::stop_token stop) {
  while (!stop.stop_requested()) {
    try {
      listener_.onMemory(gpu::sampleMemory(phase_, 0));
    } catch (const std::exception& e) {
      logWarn() << "memory sample: " << e.what();
      return;
    }
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, stop, period_, [] { return false; });
  }
}

void StepMemorySampler::afterStep(TrainListener& listener, int64_t step, bool first_or_last) {
  const auto start = std::chrono::steady_clock::now();
  if (!first_or_last && start < next_) return;
  listener.onMemory(gpu::sampleMemory("step", step));
  const auto took = std::chrono::steady_clock::now() - start;
  next_ = start + 20 * took;
}

}  // namespace tandem::train
