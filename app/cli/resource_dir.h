#pragma once
// Where the bundled resources (jieba tables, demo data) are: $TANDEM_RESOURCES, else the
// source tree's resources/ that the build recorded.

#include <cstdlib>
#include <filesystem>

namespace tandem::cli {

inline std::filesystem::path resourcesDir() {
  const char* value = std::getenv("TANDEM_RESOURCES");
  return value && *value ? std::filesystem::path(value)
                         : std::filesystem::path(TANDEM_RESOURCES_DIR);
}

}  // namespace tandem::cli
