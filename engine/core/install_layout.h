#pragma once
// Where the files Tandem ships with are (resources: the demo data, jieba tables, icons; presets:
// hardware, models, placement, training), found from the running executable so that one build
// runs from the build tree, the tarball and the package alike:
//
//   <prefix>/bin/tandem              the executable (also tandem-studio)
//   <prefix>/share/tandem/resources  resourcesDir(): $TANDEM_RESOURCES overrides
//   <prefix>/share/tandem/presets    presetsDir():   $TANDEM_PRESETS overrides
//   <prefix>/lib/tandem/             the private libraries (libtorch), found through RPATH
//
// The build tree mirrors this layout: build/share/tandem/{resources,presets} are links to the
// source tree, made at configure time. Throws tandem::Error naming the variable to set when the
// folder is missing (a moved or half-installed tree).

#include <filesystem>
#include <string>

namespace tandem {

// What the resolvers read, as values so tests can state every case. Empty means unset.
struct InstallEnvironment {
  std::filesystem::path executable;  // absolute path of the running program
  std::string resources_override;    // $TANDEM_RESOURCES
  std::string presets_override;      // $TANDEM_PRESETS

  static InstallEnvironment current();  // this process
};

// <prefix>/share/tandem for the executable <prefix>/bin/<name>.
std::filesystem::path installDataDir(const std::filesystem::path& executable);

std::filesystem::path resourcesDir(const InstallEnvironment& env = InstallEnvironment::current());
std::filesystem::path presetsDir(const InstallEnvironment& env = InstallEnvironment::current());

}  // namespace tandem
