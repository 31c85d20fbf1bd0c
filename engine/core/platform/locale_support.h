#pragma once
// Whether the C library can load a locale by name (the doctor warns on a LANG that names a locale
// this machine lacks). Linux: newlocale. Windows: _create_locale.

#include <string>

namespace tandem::platform {

bool localeIsInstalled(const std::string& name);

}  // namespace tandem::platform
