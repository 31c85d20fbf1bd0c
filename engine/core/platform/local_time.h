#pragma once
// Calendar time in the local time zone, thread-safe. Linux: localtime_r. Windows: localtime_s
// (same job, arguments the other way round).

#include <ctime>

namespace tandem::platform {

// The broken-down local time of `seconds`; all zero fields when the OS cannot convert it.
std::tm localCalendarTime(std::time_t seconds);

}  // namespace tandem::platform
