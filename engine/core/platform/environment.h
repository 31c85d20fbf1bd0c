#pragma once
// Reading, setting and clearing environment variables of this process.
// Linux: setenv / unsetenv. Windows: _putenv_s, which also updates what getenv sees.

#include <cstdlib>
#include <string>

namespace tandem::platform {

// The variable's value; empty when it is unset (callers treat empty and unset alike).
inline std::string environmentVariable(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// False when the OS refused (out of memory, a name with '=').
bool setEnvironmentVariable(const char* name, const char* value);
bool unsetEnvironmentVariable(const char* name);

}  // namespace tandem::platform
