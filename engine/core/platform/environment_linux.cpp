#include <cstdlib>

#include "engine/core/platform/environment.h"

namespace tandem::platform {

bool setEnvironmentVariable(const char* name, const char* value) {
  return ::setenv(name, value, 1) == 0;
}

bool unsetEnvironmentVariable(const char* name) { return ::unsetenv(name) == 0; }

}  // namespace tandem::platform
