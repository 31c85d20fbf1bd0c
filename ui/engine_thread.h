#pragma once
// Engine work runs on its own threads (training, chat) at a lower scheduling priority than the
// GUI thread: when the CPU is contended (every core busy with expert and libtorch math) the
// scheduler then lets the GUI thread run as soon as it has an event to handle, so the window
// stays responsive. Threads and OpenMP pools the engine thread creates inherit the priority.

namespace tandem::ui {

// Raises the calling thread's nice value by kEngineNiceIncrement (Linux: per thread). Best
// effort: a failure leaves the priority as it was.
void lowerCurrentThreadPriority();

inline constexpr int kEngineNiceIncrement = 5;

}  // namespace tandem::ui
