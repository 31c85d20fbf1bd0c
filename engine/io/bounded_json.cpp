#include "engine/io/bounded_json.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/units.h"

namespace tandem::io {
namespace {

using Json = nlohmann::json;

// Thrown from the parser callback to stop at the first container past the limit, so a deep
// input costs no more memory than the part of it that was read.
struct TooDeep {};

enum class Refusal { none, not_json, too_deep, too_large };

Refusal parseInto(std::string_view text, JsonLimits limits, Json& out, std::string& detail) {
  if (text.size() > limits.max_bytes) return Refusal::too_large;
  const Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json&) {
    // depth is the number of containers already open around the one that starts here.
    const bool container_start =
        event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
    if (container_start && depth >= limits.max_depth) throw TooDeep{};
    return true;
  };
  try {
    out = Json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/true,
                      /*ignore_comments=*/false);
  } catch (const TooDeep&) {
    return Refusal::too_deep;
  } catch (const Json::exception& e) {
    detail = e.what();
    return Refusal::not_json;
  }
  return Refusal::none;
}

}  // namespace

Json parseBoundedJson(std::string_view text, JsonLimits limits, std::string_view label) {
  Json parsed;
  std::string detail;
  switch (parseInto(text, limits, parsed, detail)) {
    case Refusal::none: return parsed;
    case Refusal::not_json:
      throw Error(std::string(label) + ": not valid JSON (" + detail + ")",
                  "the file may be truncated or corrupt; fetch or write it again");
    case Refusal::too_deep:
      throw Error(std::string(label) + ": JSON nested more than " +
                      std::to_string(limits.max_depth) + " levels deep",
                  "no valid input of this kind nests that deep; check what produced it");
    case Refusal::too_large:
      throw Error(std::string(label) + ": JSON of " + formatBytes(text.size()) +
                      " is larger than the " + formatBytes(limits.max_bytes) +
                      " accepted for this kind of input",
                  "check that this is the right file");
  }
  throw Error(std::string(label) + ": JSON refused");
}

std::optional<Json> tryParseBoundedJson(std::string_view text, JsonLimits limits) {
  Json parsed;
  std::string detail;
  if (parseInto(text, limits, parsed, detail) != Refusal::none) return std::nullopt;
  return parsed;
}

Json readBoundedJsonFile(const std::filesystem::path& path, JsonLimits limits) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec)
    throw Error("cannot read " + path.string() + ": " + ec.message(),
                "check that the file exists and is readable");
  if (size > limits.max_bytes) {
    throw Error(path.string() + ": " + formatBytes(size) + " is larger than the " +
                    formatBytes(limits.max_bytes) + " accepted for this kind of file",
                "check that this is the right file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path.string(), "check that the file is readable");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return parseBoundedJson(buffer.str(), limits, path.string());
}

std::string excerptForMessage(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  // Cut at a UTF-8 character boundary so the message stays valid text.
  size_t cut = max_chars;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "… (" + std::to_string(text.size()) + " bytes)";
}

}  // namespace tandem::io
