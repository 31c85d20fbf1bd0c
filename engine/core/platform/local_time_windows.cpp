#include "engine/core/platform/local_time.h"

namespace tandem::platform {

std::tm localCalendarTime(std::time_t seconds) {
  std::tm local{};
  if (localtime_s(&local, &seconds) != 0) return std::tm{};
  return local;
}

}  // namespace tandem::platform
