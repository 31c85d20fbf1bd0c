#pragma once
// Windows only: GetLastError() codes as std::error_code. The common file errors become their
// portable std::errc values, so messages and checks read the same as on Linux ("No such file or
// directory", errc::no_space_on_device); the rest keep the system's own text (FormatMessage).

#include <windows.h>

#include <string>
#include <system_error>

namespace tandem::platform {

std::error_code windowsErrorCode(DWORD error);

// The system's text for a code, e.g. "The process cannot access the file ...".
std::string windowsErrorMessage(DWORD error);

}  // namespace tandem::platform
