#pragma once
// adapter_config.json of a PEFT LoRA adapter: what Tandem reads of it, checked. Torch-free, so
// the reader can be unit-tested and fuzzed on its own; peft_adapter.cpp reads the weights.

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::model {

struct PeftAdapterConfig {
  int rank = 8;              // r
  double alpha = 8;          // lora_alpha
  bool rslora = false;       // use_rslora
  double dropout = 0;        // lora_dropout
  std::string peft_version;  // "" when absent
  // alpha_pattern {module suffix: alpha}, in key order (PEFT's dict order for PEFT's files).
  std::vector<std::pair<std::string, double>> alpha_pattern;

  // The alpha PEFT uses for a module: the first alpha_pattern entry that is the module's name
  // or a dotted suffix of it, else lora_alpha.
  double alphaFor(const std::string& module) const;
};

// Highest rank accepted: far above any published adapter, low enough that rank * experts *
// hidden sizes computed from it stay in range.
inline constexpr int kMaxAdapterRank = 1 << 16;

// Parses and checks adapter_config.json text; Error "<label>: ..." for JSON Tandem cannot use
// (not an object, a field of the wrong type or out of range, DoRA, trained biases, not LoRA).
PeftAdapterConfig parsePeftAdapterConfig(std::string_view json_text, const std::string& label);

// The same for dir/adapter_config.json; a missing file is an Error saying what an adapter dir
// holds.
PeftAdapterConfig readPeftAdapterConfig(const std::filesystem::path& dir);

}  // namespace tandem::model
