#include <locale.h>

#include "engine/core/platform/locale_support.h"

namespace tandem::platform {

bool localeIsInstalled(const std::string& name) {
  const locale_t locale = newlocale(LC_CTYPE_MASK, name.c_str(), locale_t{});
  if (locale == locale_t{}) return false;
  freelocale(locale);
  return true;
}

}  // namespace tandem::platform
