#pragma once
// `tandem doctor` and the studio's machine check: every check of engine/core/machine_checks.h on
// this machine, with the CPU, NUMA and GPU facts from probeMachine (what the planner sees) and the
// driver and CUDA runtime versions. It lives here, next to probeMachine, because the GPU facts
// need libtorch; this header includes neither libtorch nor CUDA.

#include <filesystem>

#include "engine/core/machine_checks.h"

namespace tandem::model {

// The checks in a fixed order: cpu, numa, huge_pages, gpu, disk, locale. `output_dir` is where a
// run would write; empty means the run store's data directory (engine/core/paths.h). Never
// throws for what it finds: a machine without a GPU driver or a home directory is a finding.
MachineReport checkThisMachine(const std::filesystem::path& output_dir = {});

}  // namespace tandem::model
