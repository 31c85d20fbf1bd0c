#pragma once
// What the placement readers (hardware presets, placement presets, KT rule files) share: reading a
// file whole, parsing YAML into an Error that names the file and line, and rejecting unknown keys.

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

namespace tandem::placement::yaml {

// The file's text; Error "cannot read <what> <path>" with `what_to_do` when it cannot be read.
std::string readFile(const std::filesystem::path& path, const std::string& what,
                     const std::string& what_to_do);

// Error "<label>: not valid YAML (line N): ..." for a syntax error.
YAML::Node parse(std::string_view text, const std::string& label);

// The text of a scalar; Error "<what> must be a text value, not a list" (or a block, or empty)
// for any other node: yaml-cpp's as<std::string>() would throw its own exception instead.
std::string text(const YAML::Node& node, const std::string& what);

// The text of a map key; Error "<where> has a key that is not a text value" for `[a]: b`.
std::string keyText(const YAML::Node& key, const std::string& where);

// "list", "block", "empty" or "text value": what a node is, for messages.
const char* kindName(const YAML::Node& node);

// Error "<where>: unknown key 'k'" listing `keys` when `node` (a map) has another key, and
// "<where> must be a block of `key: value` lines" when it is not a map.
void onlyKeys(const YAML::Node& node, const std::string& where,
              std::initializer_list<const char*> keys);

}  // namespace tandem::placement::yaml
