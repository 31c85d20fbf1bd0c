#pragma once
// Process-wide runtime settings of the programs that run the engine (tandem, the studio), made
// first thing in main(). Measurements: docs/benchmarks.md, "Generation: decode and prefill".
//
// * OpenMP wait: libtorch's OpenMP workers spin after each parallel region (libgomp's default:
//   ~300 000 spins, milliseconds) and starve the CPU expert engine's threads (decode was 5x slower
//   on 2 cores). Fully passive workers (OMP_WAIT_POLICY=PASSIVE) sleep on a futex after every
//   region instead, and a decode step is hundreds of small regions: ~260 futex calls per token and
//   a quarter of the time in the scheduler. A bounded spin (PASSIVE with GOMP_SPINCOUNT=2000, tens
//   of microseconds) catches the next region of the same step; on a machine busy with other work
//   it is slower than a purely passive wait (see the .cpp). libgomp reads both variables only when
//   it loads, before main, so the program sets them and starts itself again once. A user who set
//   either keeps their setting.
// * malloc: a decode step allocates and frees the same buffers every token; fixed glibc
//   thresholds keep them in the heap instead of returning them to the kernel and faulting them
//   in again, whatever the process allocated before; see the .cpp.

namespace tandem {

// Call first thing in main(), before any thread starts; returns normally when no restart is
// needed or exec fails (the program then runs with libgomp's defaults).
void tuneOpenMpWaitAndMalloc(char** argv);

}  // namespace tandem
