#include "engine/core/process_tuning.h"

#include <cstdlib>

#include "engine/core/platform/environment.h"
#include "engine/core/platform/process_restart.h"

namespace tandem {

namespace {

// Spins before a libgomp worker sleeps (~50 µs on the 2-core test VM, ~23 ns per pause). On a quiet
// machine this bridges the gaps between a decode step's small ops: 1.5x the passive decode speed
// in bf16. While other processes keep the cores busy, any spin is slower than a passive wait
// (2000: ~1.8x slower, 5000: ~3x, ACTIVE collapses): a machine that decodes is usually not busy
// with anything else, and the user's OMP_WAIT_POLICY wins. docs/benchmarks.md has the sweep.
constexpr const char* kOpenMpSpinCount = "2000";

// glibc malloc (mallopt(3)): blocks below the mmap threshold come from the heap, and free space
// above the trim threshold at the heap's top is returned to the kernel. The defaults start at
// 128 KiB and adapt upward only once a large block has been freed, so whether a step's buffers
// are reused or returned and faulted in again depends on the process's history (with the decode
// fixes of docs/benchmarks.md: 13 brk calls per 240 decoded tokens and 1164 at load without these
// values, none and 590 with them). Fixed values, close to where glibc's adaptation ends:
// * blocks of 32 MiB and more (weights, load-time conversions, KV caches) stay mmapped, so
//   freeing them returns them to the kernel at once, as before; 32 MiB is the ceiling glibc's
//   own adaptive threshold would climb to;
// * up to 64 MiB of free heap top is kept for reuse (also per thread arena), never more, so a
//   model load does not leave the process holding its temporaries;
// * the heap grows 16 MiB at a time, not page by page.
constexpr int kMmapThresholdBytes = 32 << 20;
constexpr int kTrimThresholdBytes = 64 << 20;
constexpr int kTopPadBytes = 16 << 20;

}  // namespace

void tuneOpenMpWaitAndMalloc(char** argv) {
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT") &&
      platform::setEnvironmentVariable("OMP_WAIT_POLICY", "PASSIVE") &&
      platform::setEnvironmentVariable("GOMP_SPINCOUNT", kOpenMpSpinCount)) {
    platform::restartSelfWithSameArguments(argv);
  }
  platform::setMallocThresholds(kMmapThresholdBytes, kTrimThresholdBytes, kTopPadBytes);
}

}  // namespace tandem
