#include "engine/core/platform/process_restart.h"

namespace tandem::platform {

void restartSelfWithSameArguments(char** /*argv*/) {}

void setMallocThresholds(int /*mmap_threshold_bytes*/, int /*trim_threshold_bytes*/,
                         int /*top_pad_bytes*/) {}

}  // namespace tandem::platform
