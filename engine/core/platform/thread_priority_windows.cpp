#include <windows.h>

#include <algorithm>

#include "engine/core/platform/thread_priority.h"

namespace tandem::platform {

bool lowerCurrentThreadPriority(int nice_increment) {
  const HANDLE thread = GetCurrentThread();
  const int current = GetThreadPriority(thread);
  if (current == THREAD_PRIORITY_ERROR_RETURN) return false;
  const int steps = std::max(1, nice_increment / 5);
  return SetThreadPriority(thread, std::max(THREAD_PRIORITY_LOWEST, current - steps)) != 0;
}

}  // namespace tandem::platform
