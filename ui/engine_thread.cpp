#include "ui/engine_thread.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace tandem::ui {

void lowerCurrentThreadPriority() {
  // On Linux the nice value belongs to the thread (PRIO_PROCESS with a thread id).
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int current = ::getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return;
  ::setpriority(PRIO_PROCESS, tid, current + kEngineNiceIncrement);
}

}  // namespace tandem::ui
