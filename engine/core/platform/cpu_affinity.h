#pragma once
// Which logical CPUs this process may run on, and pinning the calling thread to one of them.
// Linux: sched_getaffinity / pthread_setaffinity_np. Windows: the process affinity mask (the
// first processor group, 64 CPUs, which is what a process starts in) / SetThreadAffinityMask.

#include <vector>

namespace tandem::platform {

// Logical CPU ids, ascending; empty when the OS does not say.
std::vector<int> allowedCpuIds();

// Pins the calling thread to one logical CPU; false when the OS refused (the thread then floats).
bool pinCurrentThreadToCpu(int cpu_id);

}  // namespace tandem::platform
