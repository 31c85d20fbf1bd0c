#pragma once
// CPU utilisation per NUMA node between two samples, for the studio's live view (and `tandem
// info`): the share of the node's CPUs' time that was busy since the previous sample.

#include <vector>

#include "engine/core/platform/cpu_ticks.h"

namespace tandem {

struct NodeLoad {
  int node = 0;
  double busy_percent = 0;  // 0 to 100
};

class CpuLoadMeter {
 public:
  CpuLoadMeter();  // takes the first sample
  // Since the last sample (or construction). One entry per NUMA node of the machine (one for the
  // whole machine where the OS gives no per-CPU times).
  std::vector<NodeLoad> sample();

 private:
  std::vector<platform::CpuTicks> last_;
};

}  // namespace tandem
