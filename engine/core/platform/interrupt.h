#pragma once
// A console program's "stop" requests: Ctrl-C, and optionally the requests to terminate. Linux:
// SIGINT and SIGTERM (std::signal). Windows: SetConsoleCtrlHandler (CTRL_C_EVENT and
// CTRL_BREAK_EVENT; CTRL_CLOSE_EVENT, CTRL_LOGOFF_EVENT and CTRL_SHUTDOWN_EVENT for terminate).

namespace tandem::platform {

// Runs in a signal handler (Linux) or the console's control thread (Windows): it may only store
// to lock-free atomics.
using InterruptFn = void (*)();

enum class InterruptKinds { CtrlC, CtrlCAndTerminate };

// While it lives, those requests call `on_interrupt` instead of ending the process; the handlers
// before it come back when it dies. One at a time per process (the newest wins until it dies).
class ScopedInterruptHandler {
 public:
  ScopedInterruptHandler(InterruptFn on_interrupt, InterruptKinds kinds);
  ~ScopedInterruptHandler();
  ScopedInterruptHandler(const ScopedInterruptHandler&) = delete;
  ScopedInterruptHandler& operator=(const ScopedInterruptHandler&) = delete;

 private:
  using SignalHandler = void (*)(int);
  InterruptKinds kinds_;
  InterruptFn previous_fn_ = nullptr;
  SignalHandler previous_int_ = nullptr;  // Linux: the SIGINT / SIGTERM handlers to restore
  SignalHandler previous_term_ = nullptr;
};

}  // namespace tandem::platform
