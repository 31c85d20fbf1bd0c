#include <windows.h>

#include <algorithm>
#include <vector>

#include "engine/core/platform/cpu_topology.h"

namespace tandem::platform {

namespace {

// How many of the relation's entries (cores or packages) hold one of `cpu_ids` in group 0.
int countHolding(LOGICAL_PROCESSOR_RELATIONSHIP relation, const std::vector<int>& cpu_ids) {
  DWORD size = 0;
  GetLogicalProcessorInformationEx(relation, nullptr, &size);
  if (size == 0) return 0;
  std::vector<char> buf(size);
  auto* first = reinterpret_cast<SYSTEM_LOGICAL_PROCESSOR_INFORMATION_EX*>(buf.data());
  if (!GetLogicalProcessorInformationEx(relation, first, &size)) return 0;
  int count = 0;
  for (DWORD offset = 0; offset < size;) {
    const auto* info =
        reinterpret_cast<const SYSTEM_LOGICAL_PROCESSOR_INFORMATION_EX*>(buf.data() + offset);
    const PROCESSOR_RELATIONSHIP& p = info->Processor;
    bool holds = false;
    for (WORD g = 0; g < p.GroupCount && !holds; ++g) {
      if (p.GroupMask[g].Group != 0) continue;
      for (int cpu : cpu_ids) {
        if (cpu >= 0 && cpu < 64 && ((p.GroupMask[g].Mask >> cpu) & 1u)) holds = true;
      }
    }
    count += holds ? 1 : 0;
    offset += info->Size;
  }
  return count;
}

}  // namespace

CpuCoreCounts cpuCoreCounts(const std::vector<int>& cpu_ids) {
  CpuCoreCounts counts;
  counts.sockets = std::max(1, countHolding(RelationProcessorPackage, cpu_ids));
  counts.physical_cores = std::max(1, countHolding(RelationProcessorCore, cpu_ids));
  return counts;
}

}  // namespace tandem::platform
