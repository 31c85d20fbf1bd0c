#include <pthread.h>
#include <sched.h>

#include "engine/core/platform/cpu_affinity.h"

namespace tandem::platform {

std::vector<int> allowedCpuIds() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

bool pinCurrentThreadToCpu(int cpu_id) {
  if (cpu_id < 0 || cpu_id >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu_id, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

}  // namespace tandem::platform
