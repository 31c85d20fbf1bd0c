#pragma once
// The user's home directory as the account database knows it, for when the environment does not
// say (engine/core/paths.h). Linux: getpwuid_r's pw_dir. Windows: the Profile known folder
// (SHGetKnownFolderPath(FOLDERID_Profile)).

#include <filesystem>

namespace tandem::platform {

// Empty when the OS has no home directory for this user.
std::filesystem::path accountHomeDir();

}  // namespace tandem::platform
