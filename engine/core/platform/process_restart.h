#pragma once
// Process-wide runtime knobs that only some platforms have (engine/core/process_tuning.h).

#include <cstddef>

namespace tandem::platform {

// Replaces this process with a fresh run of its own executable and the same arguments, so that
// libraries that read the environment only at load time (libgomp) see a changed one. Returns only
// when that is not possible: exec failed (Linux), or the platform has no exec (Windows, where the
// MinGW/MSVC OpenMP runtimes are not libgomp's spin-wait problem).
void restartSelfWithSameArguments(char** argv);

// glibc malloc's thresholds (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_TOP_PAD). A no-op
// where malloc is not glibc's (Windows' heap has no such knobs).
void setMallocThresholds(int mmap_threshold_bytes, int trim_threshold_bytes, int top_pad_bytes);

}  // namespace tandem::platform
