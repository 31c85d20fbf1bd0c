#pragma once
// libtorch's OpenMP workers busy-wait after each parallel region by default and starve the CPU
// expert engine's threads (decode was 5x slower on 2 cores, docs/benchmarks.md). libgomp reads its
// wait policy only when it loads, before main, so a program sets OMP_WAIT_POLICY=PASSIVE and starts
// itself again once. A policy the user set is kept.

namespace tandem {

// Call first thing in main(); returns normally when no restart is needed or exec fails (the
// program then runs with the default policy).
void restartWithPassiveOpenMpWait(char** argv);

}  // namespace tandem
