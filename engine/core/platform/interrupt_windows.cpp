#include <windows.h>

#include <atomic>

#include "engine/core/platform/interrupt.h"

namespace tandem::platform {

namespace {
std::atomic<InterruptFn> g_on_interrupt{nullptr};
std::atomic<bool> g_terminate_too{false};

BOOL WINAPI onConsoleControl(DWORD event) {
  const InterruptFn fn = g_on_interrupt.load();
  if (fn == nullptr) return FALSE;
  switch (event) {
    case CTRL_C_EVENT:
    case CTRL_BREAK_EVENT: fn(); return TRUE;
    case CTRL_CLOSE_EVENT:
    case CTRL_LOGOFF_EVENT:
    case CTRL_SHUTDOWN_EVENT:
      if (!g_terminate_too.load()) return FALSE;
      fn();
      return TRUE;
    default: return FALSE;
  }
}
}  // namespace

ScopedInterruptHandler::ScopedInterruptHandler(InterruptFn on_interrupt, InterruptKinds kinds)
    : kinds_(kinds), previous_fn_(g_on_interrupt.exchange(on_interrupt)) {
  g_terminate_too.store(kinds == InterruptKinds::CtrlCAndTerminate);
  SetConsoleCtrlHandler(onConsoleControl, TRUE);
}

ScopedInterruptHandler::~ScopedInterruptHandler() {
  SetConsoleCtrlHandler(onConsoleControl, FALSE);
  g_on_interrupt.store(previous_fn_);
}

}  // namespace tandem::platform
