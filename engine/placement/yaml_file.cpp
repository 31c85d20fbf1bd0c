#include "engine/placement/yaml_file.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"

namespace tandem::placement::yaml {

std::string readFile(const std::filesystem::path& path, const std::string& what,
                     const std::string& what_to_do) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + what + " " + path.string(), what_to_do);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

YAML::Node parse(std::string_view text, const std::string& label) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw Error(label + ": not valid YAML (line " + std::to_string(e.mark.line + 1) +
                "): " + e.msg);
  }
}

void onlyKeys(const YAML::Node& node, const std::string& where,
              std::initializer_list<const char*> keys) {
  if (!node.IsMap()) throw Error(where + " must be a block of `key: value` lines");
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; })) {
      std::string known;
      for (const char* k : keys) known += (known.empty() ? "" : ", ") + std::string(k);
      throw Error(where + ": unknown key '" + key + "'", "known keys here: " + known);
    }
  }
}

}  // namespace tandem::placement::yaml
