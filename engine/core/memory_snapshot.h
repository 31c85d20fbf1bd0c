#pragma once
// One reading of where the memory is, for the memory map: the engine's ledger (what it charged,
// by device and category), what each GPU's caching allocator and driver say, and each host NUMA
// node as the OS sees it. Taken while the model loads and after every training step
// (gpu/memory_sample.h takes it; TrainListener::onMemory carries it), so the map moves.

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/host_memory.h"
#include "engine/core/memory_labels.h"
#include "engine/core/memory_ledger.h"

namespace tandem {

// GPU `index` now: libtorch's caching allocator (allocated: live tensors; reserved: what it holds
// from the driver, allocated + its cache) and the driver (cudaMemGetInfo's free and total).
struct GpuMemoryFigures {
  int index = 0;
  uint64_t allocated_bytes = 0;
  uint64_t reserved_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

struct MemorySnapshot {
  std::string phase;  // what the run was doing: "loading the model", "step", …
  int64_t step = 0;   // optimizer steps done
  std::vector<DeviceMemoryUsage> ledger;
  std::vector<LabeledBytes> labels;    // what the ledger's bytes are (memory_labels.h)
  std::vector<GpuMemoryFigures> gpus;  // empty without CUDA (a CPU build, no driver)
  std::vector<HostNodeMemory> nodes;
};

}  // namespace tandem
