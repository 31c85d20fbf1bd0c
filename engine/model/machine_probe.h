#pragma once
// The machine this process runs on, for the planner: its GPUs as libtorch sees them, its CPU and
// NUMA nodes (placement::probeHardware). No libtorch in this header.

#include <string>

#include "engine/placement/hardware.h"

namespace tandem::model {

// `gpu_status` (may be null) says why no GPU is listed, when none is.
placement::Hardware probeMachine(std::string* gpu_status = nullptr);

}  // namespace tandem::model
