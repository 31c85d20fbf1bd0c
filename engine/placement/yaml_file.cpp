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

const char* kindName(const YAML::Node& node) {
  if (node.IsSequence()) return "list";
  if (node.IsMap()) return "block";
  if (node.IsScalar()) return "text value";
  return "empty";
}

std::string text(const YAML::Node& node, const std::string& what) {
  if (node.IsScalar()) return node.Scalar();
  if (!node.IsDefined()) throw Error(what + " is missing");
  if (node.IsNull()) throw Error(what + " must be a text value, not empty");
  throw Error(what + " must be a text value, not a " + kindName(node));
}

std::string keyText(const YAML::Node& key, const std::string& where) {
  if (!key.IsScalar()) throw Error(where + " has a key that is not a text value");
  return key.Scalar();
}

void onlyKeys(const YAML::Node& node, const std::string& where,
              std::initializer_list<const char*> keys) {
  if (!node.IsMap()) throw Error(where + " must be a block of `key: value` lines");
  for (const auto& item : node) {
    const std::string key = keyText(item.first, where);
    if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; })) {
      std::string known;
      for (const char* k : keys) known += (known.empty() ? "" : ", ") + std::string(k);
      throw Error(where + ": unknown key '" + key + "'", "known keys here: " + known);
    }
  }
}

}  // namespace tandem::placement::yaml
