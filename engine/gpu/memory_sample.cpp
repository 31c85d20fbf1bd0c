#include "engine/gpu/memory_sample.h"

#include <utility>

#include "engine/gpu/torch_runtime.h"

namespace tandem::gpu {

MemorySnapshot sampleMemory(std::string phase, int64_t step) {
  MemorySnapshot s;
  s.phase = std::move(phase);
  s.step = step;
  // The devices first, the ledger last: a charge made in between shows in the ledger and, at the
  // latest, in the next snapshot's device figures, never as more ledger than device.
  s.gpus = gpuMemoryNow();
  s.nodes = hostNodeMemory();
  s.ledger = MemoryLedger::global().snapshot();
  s.labels = MemoryLabels::global().snapshot();
  return s;
}

}  // namespace tandem::gpu
