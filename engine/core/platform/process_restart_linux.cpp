#include <malloc.h>
#include <unistd.h>

#include "engine/core/platform/process_restart.h"

namespace tandem::platform {

void restartSelfWithSameArguments(char** argv) { ::execv("/proc/self/exe", argv); }

void setMallocThresholds(int mmap_threshold_bytes, int trim_threshold_bytes, int top_pad_bytes) {
  ::mallopt(M_MMAP_THRESHOLD, mmap_threshold_bytes);
  ::mallopt(M_TRIM_THRESHOLD, trim_threshold_bytes);
  ::mallopt(M_TOP_PAD, top_pad_bytes);
}

}  // namespace tandem::platform
