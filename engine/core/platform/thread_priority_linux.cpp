#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "engine/core/platform/thread_priority.h"

namespace tandem::platform {

bool lowerCurrentThreadPriority(int nice_increment) {
  // On Linux the nice value belongs to the thread (PRIO_PROCESS with a thread id).
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int current = ::getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return false;
  return ::setpriority(PRIO_PROCESS, tid, current + nice_increment) == 0;
}

}  // namespace tandem::platform
