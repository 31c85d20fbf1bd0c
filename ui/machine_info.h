#pragma once
// What the studio shows about the machine it runs on: CPU (with the AVX-512/AMX state the expert
// kernels can use), NUMA nodes with their RAM, and the GPUs libtorch sees. Detected through the
// same engine calls as `tandem info`.

#include <QString>
#include <QStringList>

#include "engine/core/cpu_features.h"
#include "engine/core/numa.h"
#include "engine/gpu/torch_runtime.h"

namespace tandem::ui {

struct MachineInfo {
  CpuFeatures cpu;
  NumaTopology numa;
  gpu::TorchRuntimeInfo torch;

  uint64_t totalRamBytes() const { return numa.totalBytes(); }
  uint64_t totalGpuBytes() const;
};

MachineInfo detectMachine();

// "AMX-BF16 + AVX-512 (usable)", or what is missing and why.
QString cpuIsaSummary(const CpuFeatures& cpu);
// One line per device: GPUs, then NUMA nodes.
QStringList describeMachine(const MachineInfo& machine);
// "12.3 GiB"
QString bytesText(uint64_t bytes);

}  // namespace tandem::ui
