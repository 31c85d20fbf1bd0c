#pragma once
// KTransformers optimize-rule files (what LLaMA-Factory's `kt_optimize_rule:` points at), read
// into a Placement and written back from one. A file is a YAML list of rules:
//
//   - match: {name: "^model\\.layers\\.(0|[1-9])\\.mlp\\.experts$", class: torch.nn.Linear}
//     replace:
//       class: ktransformers.operators.experts.KTransformersExperts
//       kwargs: {generate_device: cpu, prefill_device: "cuda:0", out_device: "cuda:0",
//                backend: AMXInt8}
//     recursive: False
//
// Each of our modules (placement.h) takes the first rule whose name regex matches its name from
// the start (Python re.match, PCRE2 syntax: lookaheads work) and whose class, when given, is the
// module's HF/KT class (compared by the last dotted component). Rules that match none of our
// modules (rotary embeddings, single Linears, `^model$`) are read and left alone. A matching rule
// Tandem cannot honour (an unknown replace class, device, backend or kwarg) is an Error naming
// the rule (1-based, as a user counts them in the file) and the module. docs/placement.md has
// the KT class/backend mapping table.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/placement/placement.h"

namespace tandem::placement {

struct KtRule {
  int number = 0;           // 1-based position in the file
  std::string name_regex;   // match.name; empty = any name
  std::string match_class;  // match.class; empty = any class
  std::string replace_class;
  std::map<std::string, std::string> kwargs;  // the text values
  // kwargs whose value is a "list" or "block" (KT's transfer_map): Tandem reads none of them.
  std::map<std::string, std::string> structured_kwargs;
  std::optional<bool> recursive;
};

struct KtRuleFile {
  std::string label;  // the file, for errors
  std::vector<KtRule> rules;
};

// Parses and checks the structure (every rule has match and replace, regexes compile).
KtRuleFile parseKtRules(std::string_view yaml_text, const std::string& label);
KtRuleFile loadKtRules(const std::filesystem::path& file);

// The placement the rules give `model`. A module no rule matches stays where KTransformers
// leaves an unmatched module: on cuda:0 (experts: cpu, backend auto).
Placement applyKtRules(const KtRuleFile& rules, const io::ModelConfig& model);

// `placement` as a rule file KTransformers and Tandem both read (Tandem-only choices, such as a
// NUMA node or the avx512_bf16 backend, go in tandem_* kwargs). applyKtRules(parse(write(p)))
// gives p back.
std::string writeKtRules(const Placement& placement, const io::ModelConfig& model);

// A placement file of either kind: a KT rule file (a YAML list) or a placement preset (a map).
Placement loadPlacementFile(const std::filesystem::path& file, const io::ModelConfig& model);

}  // namespace tandem::placement
