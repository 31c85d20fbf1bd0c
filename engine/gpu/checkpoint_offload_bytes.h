#pragma once
// How many bytes offloaded gradient checkpoints (checkpoint_offload.h) copied to host memory over
// the process, for tests and `tandem debug grad`; no libtorch here, so the CLI can ask.

#include <cstdint>

namespace tandem::gpu {

uint64_t checkpointBytesOffloaded();

}  // namespace tandem::gpu
