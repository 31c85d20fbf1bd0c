#include "ui/engine_thread.h"

#include "engine/core/platform/thread_priority.h"

namespace tandem::ui {

void lowerCurrentThreadPriority() { platform::lowerCurrentThreadPriority(kEngineNiceIncrement); }

}  // namespace tandem::ui
