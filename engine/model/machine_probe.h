#pragma once
// The machine this process runs on, as the memory planner sees it: placement::probeHardware's CPU
// features and NUMA nodes, with the GPUs libtorch sees and (CUDA builds) their PCIe links from
// sysfs. It lives here, not in placement/, because it needs libtorch and CUDA; this header
// includes neither, so the CLI and the studio call it cheaply.

#include <string>

#include "engine/placement/hardware.h"

namespace tandem::model {

// `gpu_status`, when given, says why no GPU is listed (a CPU-only libtorch, no driver, ...).
placement::Hardware probeMachine(std::string* gpu_status = nullptr);

}  // namespace tandem::model
