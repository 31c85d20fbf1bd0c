#pragma once
// Lowering the calling thread's scheduling priority, so that engine work yields to the GUI.
// Linux: the thread's own nice value (setpriority(PRIO_PROCESS, gettid())). Windows:
// SetThreadPriority, one step below normal per 5 nice steps, at most down to
// THREAD_PRIORITY_LOWEST.

namespace tandem::platform {

// `nice_increment` > 0 lowers the priority by that many nice steps; false when the OS refused.
bool lowerCurrentThreadPriority(int nice_increment);

}  // namespace tandem::platform
