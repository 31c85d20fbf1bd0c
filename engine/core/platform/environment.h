#pragma once
// Setting and clearing environment variables of this process (std::getenv reads them everywhere).
// Linux: setenv / unsetenv. Windows: _putenv_s, which also updates what getenv sees.

namespace tandem::platform {

// False when the OS refused (out of memory, a name with '=').
bool setEnvironmentVariable(const char* name, const char* value);
bool unsetEnvironmentVariable(const char* name);

}  // namespace tandem::platform
