#include <cstdlib>

#include "engine/core/platform/environment.h"

namespace tandem::platform {

// _putenv_s with an empty value removes the variable, so an empty value cannot be set on Windows.
bool setEnvironmentVariable(const char* name, const char* value) {
  return _putenv_s(name, value) == 0;
}

bool unsetEnvironmentVariable(const char* name) { return _putenv_s(name, "") == 0; }

}  // namespace tandem::platform
