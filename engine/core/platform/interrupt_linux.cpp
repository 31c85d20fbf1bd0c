#include <atomic>
#include <csignal>

#include "engine/core/platform/interrupt.h"

namespace tandem::platform {

namespace {
std::atomic<InterruptFn> g_on_interrupt{nullptr};

extern "C" void onInterruptSignal(int) {
  if (const InterruptFn fn = g_on_interrupt.load()) fn();
}
}  // namespace

ScopedInterruptHandler::ScopedInterruptHandler(InterruptFn on_interrupt, InterruptKinds kinds)
    : kinds_(kinds), previous_fn_(g_on_interrupt.exchange(on_interrupt)) {
  previous_int_ = std::signal(SIGINT, onInterruptSignal);
  if (kinds_ == InterruptKinds::CtrlCAndTerminate) {
    previous_term_ = std::signal(SIGTERM, onInterruptSignal);
  }
}

ScopedInterruptHandler::~ScopedInterruptHandler() {
  std::signal(SIGINT, previous_int_);
  if (kinds_ == InterruptKinds::CtrlCAndTerminate) std::signal(SIGTERM, previous_term_);
  g_on_interrupt.store(previous_fn_);
}

}  // namespace tandem::platform
