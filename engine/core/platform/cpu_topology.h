#pragma once
// How logical CPUs group into physical cores and sockets. Linux: sysfs
// (/sys/devices/system/cpu/cpuN/topology). Windows: GetLogicalProcessorInformationEx
// (RelationProcessorCore and RelationProcessorPackage, processor group 0).

#include <vector>

namespace tandem::platform {

struct CpuCoreCounts {
  int sockets = 1;         // packages that hold at least one of the CPUs; at least 1
  int physical_cores = 1;  // distinct cores that hold at least one of the CPUs; at least 1
};

// Counts over the logical CPU ids `cpu_ids` (as cpu_affinity.h numbers them).
CpuCoreCounts cpuCoreCounts(const std::vector<int>& cpu_ids);

}  // namespace tandem::platform
