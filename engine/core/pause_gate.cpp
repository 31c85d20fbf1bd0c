#include "engine/core/pause_gate.h"

namespace tandem {

void PauseGate::pause() {
  std::lock_guard lock(mutex_);
  paused_ = true;
}

void PauseGate::resume() {
  {
    std::lock_guard lock(mutex_);
    paused_ = false;
  }
  resumed_.notify_all();
}

bool PauseGate::paused() const {
  std::lock_guard lock(mutex_);
  return paused_;
}

bool PauseGate::wait(std::stop_token stop, std::stop_token cancel) {
  std::unique_lock lock(mutex_);
  if (!paused_ || stop.stop_requested() || cancel.stop_requested()) return false;
  // Either token ends the wait: a stop still writes its checkpoint once the worker goes on.
  std::stop_callback on_stop(stop, [this] { resumed_.notify_all(); });
  std::stop_callback on_cancel(cancel, [this] { resumed_.notify_all(); });
  resumed_.wait(lock, [&] { return !paused_ || stop.stop_requested() || cancel.stop_requested(); });
  return true;
}

}  // namespace tandem
