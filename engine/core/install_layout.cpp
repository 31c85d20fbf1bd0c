#include "engine/core/install_layout.h"

#include "engine/core/error.h"
#include "engine/core/platform/environment.h"
#include "engine/core/platform/process_info.h"

namespace tandem {

namespace {

namespace fs = std::filesystem;

fs::path shippedDir(const InstallEnvironment& env, const std::string& override_value,
                    const char* variable, const char* folder) {
  if (!override_value.empty()) {
    if (!fs::is_directory(override_value))
      throw Error(std::string(variable) + " is " + override_value + ", which is not a folder",
                  std::string("point ") + variable + " at Tandem's " + folder +
                      " folder, or unset it to use the installed one");
    return override_value;
  }
  const fs::path dir = installDataDir(env.executable) / folder;
  if (!fs::is_directory(dir))
    throw Error("Tandem's " + std::string(folder) + " folder is missing: looked for " +
                    dir.string() + " next to the program " + env.executable.string(),
                std::string("reinstall Tandem, or set ") + variable + " to the folder that holds " +
                    folder);
  return dir;
}

}  // namespace

InstallEnvironment InstallEnvironment::current() {
  InstallEnvironment env;
  env.executable = platform::executablePath();
  env.resources_override = platform::environmentVariable("TANDEM_RESOURCES");
  env.presets_override = platform::environmentVariable("TANDEM_PRESETS");
  return env;
}

fs::path installDataDir(const fs::path& executable) {
  return executable.parent_path().parent_path() / "share" / "tandem";
}

fs::path resourcesDir(const InstallEnvironment& env) {
  return shippedDir(env, env.resources_override, "TANDEM_RESOURCES", "resources");
}

fs::path presetsDir(const InstallEnvironment& env) {
  return shippedDir(env, env.presets_override, "TANDEM_PRESETS", "presets");
}

}  // namespace tandem
