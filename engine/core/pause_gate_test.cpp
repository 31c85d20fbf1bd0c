#include "engine/core/pause_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace tandem {
namespace {

using namespace std::chrono_literals;

TEST(PauseGate, AnOpenGateDoesNotWait) {
  PauseGate gate;
  EXPECT_FALSE(gate.paused());
  EXPECT_FALSE(gate.wait({}, {}));
}

TEST(PauseGate, HoldsTheWorkerUntilResumed) {
  PauseGate gate;
  gate.pause();
  std::atomic<bool> passed{false};
  std::thread worker([&] {
    EXPECT_TRUE(gate.wait({}, {}));
    passed = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(passed.load());
  gate.resume();
  worker.join();
  EXPECT_TRUE(passed.load());
  EXPECT_FALSE(gate.paused());
}

TEST(PauseGate, StopOrCancelEndTheWaitWhilePaused) {
  for (bool use_cancel : {false, true}) {
    PauseGate gate;
    gate.pause();
    std::stop_source stop, cancel;
    std::thread worker([&] { EXPECT_TRUE(gate.wait(stop.get_token(), cancel.get_token())); });
    std::this_thread::sleep_for(20ms);
    (use_cancel ? cancel : stop).request_stop();
    worker.join();
    EXPECT_TRUE(gate.paused());  // still paused: the worker left because of the token
    EXPECT_FALSE(gate.wait(stop.get_token(), cancel.get_token()));
  }
}

}  // namespace
}  // namespace tandem
