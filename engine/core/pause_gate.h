#pragma once
// A gate a long-running worker passes at its safe points (the trainer: between optimizer steps).
// pause() and resume() may come from any thread (the studio's GUI thread); the worker's wait()
// returns at once while the gate is open, and otherwise when it is resumed or when the stop or
// cancel token fires, so a paused run can still be stopped (with its checkpoint) or cancelled.

#include <condition_variable>
#include <mutex>
#include <stop_token>

namespace tandem {

class PauseGate {
 public:
  void pause();
  void resume();
  bool paused() const;

  // Blocks while paused, until resume() or until either token is triggered. Returns whether it
  // waited.
  bool wait(std::stop_token stop, std::stop_token cancel);

 private:
  mutable std::mutex mutex_;
  std::condition_variable_any resumed_;
  bool paused_ = false;
};

}  // namespace tandem
