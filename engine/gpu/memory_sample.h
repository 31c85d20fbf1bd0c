#pragma once
// Takes a MemorySnapshot now: the process-wide ledger, the GPUs' allocator and driver figures,
// the host NUMA nodes. No libtorch in here, so the studio and the CLI can include it.

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/memory_snapshot.h"

namespace tandem::gpu {

// Every visible GPU now: the caching allocator's current allocated/reserved bytes (0 on a GPU it
// has not touched yet) and cudaMemGetInfo's free/total. Empty without CUDA or a driver.
// (Defined in torch_runtime.cpp, beside the other allocator calls.)
std::vector<GpuMemoryFigures> gpuMemoryNow();

MemorySnapshot sampleMemory(std::string phase, int64_t step);

}  // namespace tandem::gpu
