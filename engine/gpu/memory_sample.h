#pragma once
// Takes a MemorySnapshot now: the process-wide ledger, the GPUs' allocator and driver figures,
// the host NUMA nodes. No libtorch in here, so the studio and the CLI can include it.

#include <cstdint>
#include <string>

#include "engine/core/memory_snapshot.h"

namespace tandem::gpu {

MemorySnapshot sampleMemory(std::string phase, int64_t step);

}  // namespace tandem::gpu
