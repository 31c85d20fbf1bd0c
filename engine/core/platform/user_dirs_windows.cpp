#include <windows.h>
// windows.h first: shlobj.h needs its types.
#include <knownfolders.h>
#include <shlobj.h>

#include "engine/core/platform/user_dirs.h"

namespace tandem::platform {

std::filesystem::path accountHomeDir() {
  PWSTR path = nullptr;
  std::filesystem::path home;
  if (SUCCEEDED(SHGetKnownFolderPath(FOLDERID_Profile, 0, nullptr, &path))) home = path;
  CoTaskMemFree(path);
  return home;
}

}  // namespace tandem::platform
