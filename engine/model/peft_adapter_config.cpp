#include "engine/model/peft_adapter_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/io/bounded_json.h"

namespace tandem::model {
namespace {

using Json = nlohmann::json;

constexpr const char* kResave = "fix the file or save the adapter again with PEFT or Tandem";

// Typed access to the fields of adapter_config.json; null counts as absent, as in PEFT.
class ConfigFields {
 public:
  ConfigFields(const Json& root, const std::string& label) : root_(root), label_(label) {}

  const Json* get(const char* key) const {
    const auto it = root_.find(key);
    return it == root_.end() || it->is_null() ? nullptr : &*it;
  }

  [[noreturn]] void fail(const std::string& key, const std::string& problem,
                         const std::string& what_to_do = kResave) const {
    throw Error(label_ + ": '" + key + "' " + problem, what_to_do);
  }

  double number(const char* key, double fallback) const {
    const Json* value = get(key);
    if (value == nullptr) return fallback;
    if (!value->is_number() || !std::isfinite(value->get<double>()))
      fail(key, "must be a number, got " + shown(*value));
    return value->get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    const Json* value = get(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) fail(key, "must be true or false, got " + shown(*value));
    return value->get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    const Json* value = get(key);
    if (value == nullptr) return fallback;
    if (!value->is_string()) fail(key, "must be a string, got " + shown(*value));
    return value->get<std::string>();
  }

  static std::string shown(const Json& value) { return io::excerptForMessage(value.dump()); }

 private:
  const Json& root_;
  const std::string& label_;
};

int readRank(const ConfigFields& f) {
  const double r = f.number("r", 8);
  if (r != std::trunc(r) || r < 1 || r > kMaxAdapterRank) {
    f.fail("r", "must be a whole number from 1 to " + std::to_string(kMaxAdapterRank) + ", got " +
                    ConfigFields::shown(*f.get("r")));
  }
  return static_cast<int>(r);
}

std::vector<std::pair<std::string, double>> readAlphaPattern(const ConfigFields& f) {
  std::vector<std::pair<std::string, double>> pattern;
  const Json* value = f.get("alpha_pattern");
  if (value == nullptr) return pattern;
  if (!value->is_object()) f.fail("alpha_pattern", "must be an object {module: alpha}");
  for (const auto& [key, alpha] : value->items()) {
    if (!alpha.is_number() || !std::isfinite(alpha.get<double>())) {
      f.fail("alpha_pattern", "entry \"" + io::excerptForMessage(key) +
                                  "\" must be a number, got " + ConfigFields::shown(alpha));
    }
    pattern.emplace_back(key, alpha.get<double>());
  }
  return pattern;
}

PeftAdapterConfig configFrom(const Json& root, const std::string& label) {
  if (!root.is_object()) {
    throw Error(label + ": expected a JSON object at the top level",
                "this is not an adapter_config.json");
  }
  const ConfigFields f(root, label);
  const std::string type = f.text("peft_type", "LORA");
  if (type != "LORA") {
    f.fail("peft_type", "is \"" + io::excerptForMessage(type) + "\"; Tandem reads LoRA adapters",
           "use a LoRA adapter");
  }
  if (f.flag("use_dora", false))
    f.fail("use_dora", "is true: DoRA adapters are not supported", "use a plain LoRA adapter");
  if (const Json* bias = f.get("bias");
      bias != nullptr && !(bias->is_string() && *bias == "none")) {
    f.fail("bias",
           "is " + ConfigFields::shown(*bias) + ": adapters that train biases are not supported",
           "use an adapter saved with bias=\"none\"");
  }
  PeftAdapterConfig config;
  config.rank = readRank(f);
  config.alpha = f.number("lora_alpha", 8);
  config.rslora = f.flag("use_rslora", false);
  config.dropout = f.number("lora_dropout", 0);
  if (config.dropout < 0 || config.dropout > 1) f.fail("lora_dropout", "must be from 0 to 1");
  config.peft_version = f.text("peft_version", "");
  config.alpha_pattern = readAlphaPattern(f);
  return config;
}

}  // namespace

double PeftAdapterConfig::alphaFor(const std::string& module) const {
  for (const auto& [key, value] : alpha_pattern) {
    if (module == key || (module.size() > key.size() && module.ends_with("." + key))) return value;
  }
  return alpha;
}

PeftAdapterConfig parsePeftAdapterConfig(std::string_view json_text, const std::string& label) {
  return configFrom(io::parseBoundedJson(json_text, io::kAdapterConfigJsonLimits, label), label);
}

PeftAdapterConfig readPeftAdapterConfig(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "adapter_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error("cannot read " + path.string(),
                "an adapter dir holds adapter_config.json and adapter_model.safetensors");
  }
  return configFrom(io::readBoundedJsonFile(path, io::kAdapterConfigJsonLimits), path.string());
}

}  // namespace tandem::model
