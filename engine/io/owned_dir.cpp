#include "engine/io/owned_dir.h"

#include <algorithm>
#include <string_view>

namespace tandem::io {
namespace {

bool matchesPattern(std::string_view name, std::string_view pattern) {
  while (!pattern.empty()) {
    if (pattern.front() == '<') {
      const size_t close = pattern.find('>');
      if (close == std::string_view::npos) return false;
      pattern.remove_prefix(close + 1);
      size_t digits = 0;
      while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') ++digits;
      if (digits == 0 || digits > 18) return false;
      name.remove_prefix(digits);
      continue;
    }
    if (name.empty() || name.front() != pattern.front()) return false;
    name.remove_prefix(1);
    pattern.remove_prefix(1);
  }
  return name.empty();
}

}  // namespace

bool isListedArtefact(const std::string& name, const std::vector<std::string>& artefacts) {
  return std::any_of(artefacts.begin(), artefacts.end(),
                     [&](const std::string& a) { return matchesPattern(name, a); });
}

std::vector<std::string> unlistedEntries(const std::filesystem::path& dir,
                                         const std::vector<std::string>& artefacts) {
  std::vector<std::string> unlisted;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!isListedArtefact(name, artefacts) || entry.is_symlink()) unlisted.push_back(name);
  }
  std::sort(unlisted.begin(), unlisted.end());
  return unlisted;
}

std::string nameList(const std::vector<std::string>& names) {
  std::string out;
  const size_t shown = std::min<size_t>(names.size(), 8);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

}  // namespace tandem::io
