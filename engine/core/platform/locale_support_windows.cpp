#include <locale.h>

#include "engine/core/platform/locale_support.h"

namespace tandem::platform {

bool localeIsInstalled(const std::string& name) {
  const _locale_t locale = _create_locale(LC_CTYPE, name.c_str());
  if (!locale) return false;
  _free_locale(locale);
  return true;
}

}  // namespace tandem::platform
