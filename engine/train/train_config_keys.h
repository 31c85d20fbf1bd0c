#pragma once
// Internals of train_config.cpp; not part of the API. The key table (every key a training config
// may contain: Tandem settings and the LLaMA-Factory / KTransformers spellings that feed them,
// the keys accepted and ignored, the keys refused as unsupported) and the conversions that turn
// a key's YAML value into a setting. train_config.cpp reads the document and the sections.

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::train::detail {

// ---------------------------------------------------------------------------------------------
// The key table. Every key a config may contain is here; anything else is "unknown".

enum class Kind : uint8_t {
  Setting,      // feeds the TrainConfig setting `target`
  Ignored,      // accepted and ignored (harmless: logging integrations, worker counts, ...)
  Unsupported,  // LLaMA-Factory / KTransformers has it, Tandem does not (unless it is `off`)
};

struct Entry;
using CheckFn = void (*)(const Entry&);

struct KeySpec {
  std::string spelling;  // top-level key, or "kt_config.<name without kt_>"
  Kind kind = Kind::Setting;
  std::string target;       // Setting: the setting it feeds (several spellings may feed one)
  std::string note;         // Unsupported: why and what to do instead
  std::string off;          // Unsupported: the value that means "not used" ("false", "concat", ...)
  bool kt = false;          // a KTransformers key (refused when use_kt: false)
  CheckFn check = nullptr;  // Ignored: validates the value anyway
};

// One key of the config, after kt_config is flattened and the overrides are applied.
// Never assigned: yaml-cpp's Node::operator= writes through to the shared node instead of
// rebinding, so assigning Entries would corrupt the values of others.
struct Entry {
  Entry& operator=(const Entry&) = delete;

  std::string spelling;  // as in KeySpec
  std::string display;   // as the user wrote it ("kt_config.kt_backend")
  YAML::Node value;
  std::string where;  // "file.yaml:12" or "command-line override 'k=v'"
  const KeySpec* spec = nullptr;
};

// The value as the user wrote it (flow style for sequences and maps), for messages.
std::string shown(const YAML::Node& node);

// Errors naming where and which key. Without `what_to_do`, the advice is to fix the key.
[[noreturn]] void fail(const Entry& e, const std::string& problem, std::string what_to_do = {});
[[noreturn]] void failValue(const Entry& e, const std::string& expected);

// The table's entry for `spelling` ("lora_rank", "kt_backend", "kt_config.backend"), or nullptr.
const KeySpec* findKey(std::string_view spelling);

// "unknown key 'learning_rat' — did you mean 'learning_rate'?" Nested keys are compared with
// nested keys only, and the suggestion keeps the user's kt_ prefix style.
[[noreturn]] void failUnknown(const std::string& spelling, const std::string& display,
                              const std::string& where);

// ---------------------------------------------------------------------------------------------
// Value conversions. Each takes the Entry so that an error names where and which key.

std::string text(const Entry& e);
bool boolean(const Entry& e);
int64_t integer(const Entry& e, const char* expected = "an integer");
int64_t positiveInt(const Entry& e);
int64_t nonNegativeInt(const Entry& e);
double number(const Entry& e, const char* expected = "a number");
double positiveNumber(const Entry& e);
double nonNegativeNumber(const Entry& e);
// [0, 1): probabilities, ratios, Adam betas.
double unitFraction(const Entry& e);
// Readers with an upper bound, for doc.get: `PositiveIntUpTo{65536}` refuses 0 as positiveInt
// does and 70000 as "must be a positive integer up to 65536, got '70000'".
struct PositiveIntUpTo {
  int64_t hi;
  int64_t operator()(const Entry& e) const;
};
struct NonNegativeIntUpTo {  // [0, hi]
  int64_t hi;
  int64_t operator()(const Entry& e) const;
};
struct PositiveNumberUpTo {  // (0, hi]
  double hi;
  double operator()(const Entry& e) const;
};
struct NonNegativeNumberUpTo {  // [0, hi]
  double hi;
  double operator()(const Entry& e) const;
};
// A bound as an error message shows it: 1000000, 0.5, 1e+20.
std::string boundText(double value);
// LLaMA-Factory writes lists as "a, b, c"; a YAML sequence is accepted too.
std::vector<std::string> list(const Entry& e);
std::string oneOf(const Entry& e, std::initializer_list<std::string_view> allowed);
// Tandem names, and KTransformers' (AMXBF16, AMXInt8, LLAMAFILE, ...) in any case or spelling.
std::string expertsBackend(const Entry& e);
// auto, bf16, int8, fp8 (KTransformers' kt_expert_weight_format spells them the same), any case.
std::string expertsFormat(const Entry& e);
std::string int4Group(const Entry& e);        // experts_int4_group: 32 | 64 | 128
std::string expertsWtPolicy(const Entry& e);  // auto, persistent, on_demand
std::string gpuExperts(const Entry& e);       // auto or a count >= 0
std::string device(const Entry& e);           // auto, cpu, cuda or cuda:N
std::string loraExperts(const Entry& e);      // auto or a count in [0, 64], as text

}  // namespace tandem::train::detail
