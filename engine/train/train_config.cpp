#include "engine/train/train_config.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <type_traits>

#include <yaml-cpp/yaml.h>

#include "engine/core/error.h"

namespace tandem::train {
namespace {

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
  std::string target;    // Setting: the setting it feeds (several spellings may feed one)
  std::string note;      // Unsupported: why and what to do instead
  std::string off;       // Unsupported: the value that means "not used" ("false", "concat", ...)
  bool kt = false;       // a KTransformers key (refused when use_kt: false)
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
  std::string where;     // "file.yaml:12" or "command-line override 'k=v'"
  const KeySpec* spec = nullptr;
};

std::string shown(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

[[noreturn]] void fail(const Entry& e, const std::string& problem, std::string what_to_do = {}) {
  if (what_to_do.empty()) {
    what_to_do = e.where.starts_with("command-line")
                     ? "fix the override"
                     : "fix " + e.display + " (docs/training_config.md lists every key)";
  }
  throw Error(e.where + ": " + e.display + " " + problem, what_to_do);
}

[[noreturn]] void failValue(const Entry& e, const std::string& expected) {
  fail(e, "must be " + expected + ", got '" + shown(e.value) + "'");
}

void checkReportTo(const Entry& e);
void checkUseKt(const Entry& e);
void checkExpertWeightFormat(const Entry& e);
void checkNumGpuExperts(const Entry& e);
void checkPositiveInt(const Entry& e);

const std::string kGc = "LLaMA-Factory controls it with disable_gradient_checkpointing "
                        "(default false = checkpointing on); use that key";

void addSettingKeys(std::vector<KeySpec>& keys) {
  auto setting = [&](std::string name) { keys.push_back({name, Kind::Setting, name}); };
  for (const char* name :
       {"model_name_or_path", "adapter_name_or_path", "template", "enable_thinking", "stage",
        "do_train", "finetuning_type", "lora_rank", "lora_alpha", "lora_dropout", "lora_target",
        "use_rslora", "dataset", "eval_dataset", "dataset_dir", "cutoff_len", "max_samples",
        "val_size", "train_on_prompt", "mask_history", "packing", "per_device_train_batch_size",
        "gradient_accumulation_steps", "learning_rate", "num_train_epochs", "max_steps",
        "lr_scheduler_type", "warmup_ratio", "warmup_steps", "max_grad_norm", "weight_decay",
        "adam_beta1", "adam_beta2", "adam_epsilon", "seed", "bf16", "optim",
        "disable_gradient_checkpointing", "eval_strategy", "eval_steps",
        "per_device_eval_batch_size", "output_dir", "overwrite_output_dir", "logging_steps",
        "save_steps", "save_total_limit", "save_only_model", "plot_loss", "resume_from_checkpoint",
        "experts_backend", "expert_threads", "placement_rule", "expert_chunk_tokens",
        "expert_weight_path", "device", "loss_chunk_tokens"}) {
    setting(name);
  }
  for (const char* name :
       {"trust_remote_code", "ddp_timeout", "flash_attn", "preprocessing_num_workers",
        "overwrite_cache", "dataloader_num_workers", "dataloader_pin_memory",
        "dataloader_persistent_workers", "do_eval", "use_fast_tokenizer", "low_cpu_mem_usage",
        "run_name", "logging_dir", "print_param_status", "cache_dir"}) {
    keys.push_back({name, Kind::Ignored});
  }
  keys.push_back({"report_to", Kind::Ignored, {}, {}, {}, false, checkReportTo});
}

void addKtKeys(std::vector<KeySpec>& keys) {
  // KTransformers generation 1 (LLaMA-Factory's KTransformersArguments).
  keys.push_back({"cpu_infer", Kind::Setting, "expert_threads", {}, {}, true});
  keys.push_back({"chunk_size", Kind::Setting, "expert_chunk_tokens", {}, {}, true});
  keys.push_back({"use_kt", Kind::Ignored, {}, {}, {}, true, checkUseKt});
  keys.push_back({"mode", Kind::Ignored, {}, {}, {}, true});  // inference: normal|long_context
  // KTransformers generations 2 (top-level kt_<name>) and 3 (kt_config: {<name> | kt_<name>}).
  struct KtKey { const char* name; Kind kind; const char* target; CheckFn check; };
  const KtKey kt_keys[] = {
      {"backend", Kind::Setting, "experts_backend", nullptr},
      {"method", Kind::Setting, "experts_backend", nullptr},
      {"num_threads", Kind::Setting, "expert_threads", nullptr},
      {"optimize_rule", Kind::Setting, "placement_rule", nullptr},
      {"chunk_size", Kind::Setting, "expert_chunk_tokens", nullptr},
      {"weight_path", Kind::Setting, "expert_weight_path", nullptr},
      {"expert_weight_format", Kind::Ignored, "", checkExpertWeightFormat},
      {"num_gpu_experts", Kind::Ignored, "", checkNumGpuExperts},
      {"enabled", Kind::Ignored, "", checkUseKt},
      {"lora_rank", Kind::Ignored, "", checkPositiveInt},  // must equal lora_rank (checked later)
      // Buffer, thread-pool and lifetime tuning of KT's own runtime; Tandem decides these itself.
      {"weight_lifecycle", Kind::Ignored, "", nullptr},
      {"tp_enabled", Kind::Ignored, "", nullptr},
      {"threadpool_count", Kind::Ignored, "", nullptr},
      {"max_cache_depth", Kind::Ignored, "", nullptr},
      {"share_backward_bb", Kind::Ignored, "", nullptr},
      {"model_max_length", Kind::Ignored, "", nullptr},
      {"force_fused_expert_lora", Kind::Ignored, "", nullptr},
      {"skip_expert_loading", Kind::Ignored, "", nullptr},
      {"cpu_activation", Kind::Ignored, "", nullptr},
      // KT inference engine settings (LLaMA-Factory's chat/infer path), irrelevant to training.
      {"maxlen", Kind::Ignored, "", nullptr},
      {"use_cuda_graph", Kind::Ignored, "", nullptr},
      {"mode", Kind::Ignored, "", nullptr},
      {"force_think", Kind::Ignored, "", nullptr},
  };
  for (const KtKey& k : kt_keys) {
    for (std::string prefix : {"kt_", "kt_config."}) {
      keys.push_back({prefix + k.name, k.kind, k.target, {}, {}, true, k.check});
    }
  }
  for (std::string prefix : {"kt_", "kt_config."}) {
    keys.push_back({prefix + "non_expert_weight_path", Kind::Unsupported, {},
                    "Tandem reads the non-expert weights from model_name_or_path", {}, true});
  }
}

void addUnsupportedKeys(std::vector<KeySpec>& keys) {
  auto unsupported = [&](std::string name, std::string note, std::string off = {}) {
    keys.push_back({std::move(name), Kind::Unsupported, {}, std::move(note), std::move(off)});
  };
  const std::string one_gpu = "Tandem keeps routed experts on the CPU and the rest on one device";
  unsupported("deepspeed", one_gpu + "; DeepSpeed does not apply");
  unsupported("fsdp", one_gpu + "; FSDP does not apply");
  unsupported("fsdp_config", one_gpu + "; FSDP does not apply");
  unsupported("quantization_bit", "QLoRA (bitsandbytes/HQQ/EETQ) is not implemented");
  unsupported("quantization_method", "QLoRA (bitsandbytes/HQQ/EETQ) is not implemented");
  unsupported("quantization_type", "QLoRA (bitsandbytes/HQQ/EETQ) is not implemented");
  unsupported("fp16", "Tandem trains in bf16 or fp32; use bf16: true", "false");
  unsupported("pure_bf16", "Tandem keeps fp32 master weights for the LoRA parameters", "false");
  unsupported("gradient_checkpointing", kGc);
  unsupported("neftune_noise_alpha", "NEFTune is not implemented");
  unsupported("rope_scaling", "RoPE scaling comes from the model's config.json only");
  unsupported("neat_packing", "use packing: true (contamination-free packing is not implemented)",
              "false");
  unsupported("streaming", "datasets are read fully", "false");
  unsupported("tokenized_path", "Tandem caches tokenized datasets itself");
  unsupported("mix_strategy", "datasets are concatenated", "concat");
  unsupported("interleave_probs", "datasets are concatenated");
  unsupported("disable_shuffling", "the sampler always shuffles (by seed)", "false");
  unsupported("model_revision", "point model_name_or_path at a local directory", "main");
  unsupported("lr_scheduler_kwargs", "schedulers take no extra arguments");
  unsupported("label_smoothing_factor", "label smoothing is not implemented", "0.0");
  unsupported("save_strategy", "checkpoints are saved every save_steps", "steps");
  unsupported("tf32", "the GPU math precision is fixed by Tandem");
  unsupported("moe_aux_loss_coef", "the router is frozen; there is no auxiliary loss to weigh");
  unsupported("additional_target", "only LoRA modules (lora_target) are trained");
  unsupported("loraplus_lr_ratio", "LoRA+ is not implemented");
  unsupported("add_tokens", "the vocabulary is fixed");
  unsupported("add_special_tokens", "the vocabulary is fixed");
  for (const char* name :
       {"use_unsloth", "use_unsloth_gc", "enable_liger_kernel", "shift_attn", "use_dora",
        "pissa_init", "pissa_convert", "create_new_adapter", "use_galore", "use_apollo",
        "use_badam", "use_adam_mini", "use_muon", "use_llama_pro", "upcast_layernorm",
        "upcast_lmhead_output", "resize_vocab", "train_from_scratch", "torch_compile",
        "do_predict", "predict_with_generate", "compute_accuracy"}) {
    unsupported(name, "this LLaMA-Factory feature is not implemented in Tandem", "false");
  }
  unsupported("mixture_of_depths", "this LLaMA-Factory feature is not implemented in Tandem");
}

std::vector<KeySpec> buildKeyTable() {
  std::vector<KeySpec> keys;
  addSettingKeys(keys);
  addKtKeys(keys);
  addUnsupportedKeys(keys);
  return keys;
}

const std::vector<KeySpec>& keyTable() {
  static const std::vector<KeySpec> table = buildKeyTable();
  return table;
}

const KeySpec* findKey(std::string_view spelling) {
  for (const KeySpec& spec : keyTable()) {
    if (spec.spelling == spelling) return &spec;
  }
  return nullptr;
}

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

// "unknown key 'learning_rat' — did you mean 'learning_rate'?" Nested keys are compared with
// nested keys only, and the suggestion keeps the user's kt_ prefix style.
[[noreturn]] void failUnknown(const std::string& spelling, const std::string& display,
                              const std::string& where) {
  const bool nested = spelling.starts_with("kt_config.");
  const KeySpec* best = nullptr;
  size_t best_distance = 0;
  for (const KeySpec& spec : keyTable()) {
    if (spec.spelling.starts_with("kt_config.") != nested) continue;
    size_t distance = editDistance(spelling, spec.spelling);
    if (best == nullptr || distance < best_distance) best = &spec, best_distance = distance;
  }
  std::string message = where + ": unknown key '" + display + "'";
  if (best != nullptr && best_distance <= std::max<size_t>(3, spelling.size() / 2)) {
    std::string suggestion = best->spelling;
    if (nested && display.starts_with("kt_config.kt_")) {
      suggestion = "kt_config.kt_" + suggestion.substr(10);
    }
    message += " \u2014 did you mean '" + suggestion + "'?";
  }
  throw Error(message, "docs/training_config.md lists every key Tandem reads");
}

// ---------------------------------------------------------------------------------------------
// Value conversions. Each takes the Entry so that an error names where and which key.

std::string text(const Entry& e) {
  if (!e.value.IsScalar()) failValue(e, "a single value");
  return e.value.Scalar();
}

bool boolean(const Entry& e) {
  bool value = false;
  if (!e.value.IsScalar() || !YAML::convert<bool>::decode(e.value, value)) {
    failValue(e, "true or false");
  }
  return value;
}

std::optional<double> parseNumber(std::string s) {
  if (!s.empty() && s[0] == '+') s.erase(0, 1);
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

std::optional<int64_t> parseInteger(const std::string& s) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) return value;
  // 8.0 is an integer too: PyYAML hands LLaMA-Factory a float, which its dataclasses accept.
  std::optional<double> d = parseNumber(s);
  if (d && *d == std::floor(*d) && std::fabs(*d) < 9e15) return static_cast<int64_t>(*d);
  return std::nullopt;
}

int64_t integer(const Entry& e, const char* expected = "an integer") {
  std::optional<int64_t> value = e.value.IsScalar() ? parseInteger(e.value.Scalar()) : std::nullopt;
  if (!value) failValue(e, expected);
  return *value;
}

int64_t positiveInt(const Entry& e) {
  int64_t value = integer(e, "a positive integer");
  if (value <= 0) failValue(e, "a positive integer");
  return value;
}

int64_t nonNegativeInt(const Entry& e) {
  int64_t value = integer(e, "an integer >= 0");
  if (value < 0) failValue(e, "an integer >= 0");
  return value;
}

double number(const Entry& e, const char* expected = "a number") {
  std::optional<double> value = e.value.IsScalar() ? parseNumber(e.value.Scalar()) : std::nullopt;
  if (!value) failValue(e, expected);
  return *value;
}

double positiveNumber(const Entry& e) {
  double value = number(e, "a positive number");
  if (value <= 0) failValue(e, "a positive number");
  return value;
}

double nonNegativeNumber(const Entry& e) {
  double value = number(e, "a number >= 0");
  if (value < 0) failValue(e, "a number >= 0");
  return value;
}

// [0, 1): probabilities, ratios, Adam betas.
double unitFraction(const Entry& e) {
  double value = number(e, "a number in [0, 1)");
  if (value < 0 || value >= 1) failValue(e, "a number in [0, 1)");
  return value;
}

// LLaMA-Factory writes lists as "a, b, c"; a YAML sequence is accepted too.
std::vector<std::string> list(const Entry& e) {
  std::vector<std::string> items;
  auto add = [&](const std::string& part) {
    const size_t begin = part.find_first_not_of(" \t");
    if (begin == std::string::npos) return;
    items.push_back(part.substr(begin, part.find_last_not_of(" \t") + 1 - begin));
  };
  if (e.value.IsSequence()) {
    for (const YAML::Node& item : e.value) {
      if (!item.IsScalar()) failValue(e, "a comma-separated list of names");
      add(item.Scalar());
    }
  } else {
    std::stringstream parts(text(e));
    for (std::string part; std::getline(parts, part, ',');) add(part);
  }
  if (items.empty()) failValue(e, "a comma-separated list of names");
  return items;
}

std::string oneOf(const Entry& e, std::initializer_list<std::string_view> allowed) {
  std::string value = text(e);
  for (std::string_view name : allowed) {
    if (value == name) return value;
  }
  std::string names;
  for (std::string_view name : allowed) names += (names.empty() ? "" : ", ") + std::string(name);
  fail(e, "must be one of " + names + "; got '" + value + "'");
}

std::string lowered(std::string s) {
  std::string out;
  for (char c : s) {
    if (c != '_' && c != '-') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

constexpr std::string_view kBackends =
    "auto, generic, avx512, avx512_bf16, amx_bf16, amx_int8, onednn";

// Tandem names, and KTransformers' (AMXBF16, AMXInt8, LLAMAFILE, ...) in any case or spelling.
std::string expertsBackend(const Entry& e) {
  static const std::map<std::string, std::string> names = {
      {"auto", "auto"},         {"generic", "generic"},          {"avx512", "avx512"},
      {"avx512bf16", "avx512_bf16"}, {"amxbf16", "amx_bf16"},    {"amxint8", "amx_int8"},
      {"onednn", "onednn"},
      // KT's llamafile kernels are its portable (non-AMX) path; Tandem's is generic.
      {"llamafile", "generic"}};
  const std::string key = lowered(text(e));
  if (auto it = names.find(key); it != names.end()) return it->second;
  static const std::array<std::string_view, 11> kt_only = {
      "amxint4", "rawint4", "gptqint4", "fp8", "fp8perchannel", "mxfp4",
      "moeint8", "moeint4", "bf16", "torchbf16", "armbf16"};
  if (std::find(kt_only.begin(), kt_only.end(), key) != kt_only.end()) {
    fail(e, "'" + text(e) + "' is a KTransformers backend Tandem does not have",
         "use one of " + std::string(kBackends) + " (Tandem reads bf16/fp16/fp32 experts)");
  }
  fail(e, "must be one of " + std::string(kBackends) + " (or a KTransformers name: AMXBF16, "
          "AMXInt8, llamafile); got '" + text(e) + "'");
}

std::string device(const Entry& e) {
  std::string value = text(e);
  if (value == "auto" || value == "cpu" || value == "cuda") return value;
  if (value.starts_with("cuda:") && value.size() > 5 &&
      std::all_of(value.begin() + 5, value.end(), [](char c) { return std::isdigit(c) != 0; })) {
    return value;
  }
  fail(e, "must be auto, cpu, cuda or cuda:N; got '" + value + "'");
}

void checkReportTo(const Entry& e) {
  std::vector<std::string> values =
      e.value.IsSequence() && e.value.size() == 0 ? std::vector<std::string>{} : list(e);
  for (const std::string& value : values) {
    if (lowered(value) != "none") {
      fail(e, "'" + value + "' is not supported: Tandem writes its own metrics log",
           "set report_to: none");
    }
  }
}

void checkUseKt(const Entry& e) { boolean(e); }
void checkPositiveInt(const Entry& e) { positiveInt(e); }

void checkExpertWeightFormat(const Entry& e) {
  std::string value = lowered(text(e));
  if (value != "bf16" && value != "auto") {
    fail(e, "'" + text(e) + "' is not supported: Tandem reads the model's own expert weights",
         "remove it (or use bf16) and point model_name_or_path at the original checkpoint");
  }
}

void checkNumGpuExperts(const Entry& e) {
  if (nonNegativeInt(e) != 0) {
    fail(e, "is not supported: Tandem keeps every routed expert on the CPU", "remove it or set 0");
  }
}

// ---------------------------------------------------------------------------------------------
// The document: flattened entries, overrides applied.

class Doc {
 public:
  Doc(std::string_view yaml_text, const std::string& label,
      const std::vector<std::string>& overrides);

  // The value of setting `target` converted by `convert`, or nullopt when no spelling is given.
  // Several spellings (kt_backend and experts_backend) must agree.
  template <class Convert>
  auto get(std::string_view target, Convert convert) const
      -> std::optional<std::invoke_result_t<Convert, const Entry&>> {
    std::optional<std::invoke_result_t<Convert, const Entry&>> result;
    const Entry* first = nullptr;
    for (const Entry& e : entries_) {
      if (e.spec->kind != Kind::Setting || e.spec->target != target) continue;
      auto value = convert(e);
      if (!result) {
        result = std::move(value), first = &e;
      } else if (!(*result == value)) {
        fail(e, "('" + shown(e.value) + "') conflicts with " + first->display + " ('" +
                    shown(first->value) + "', " + first->where + ")",
             "keep one of them");
      }
    }
    return result;
  }

  template <class Convert>
  auto required(std::string_view target, Convert convert, const std::string& example) const {
    auto value = get(target, convert);
    if (!value) {
      throw Error(label_ + ": " + std::string(target) + " is missing (required)",
                  "add `" + std::string(target) + ": " + example + "`");
    }
    return *value;
  }

  const Entry* find(std::string_view spelling) const {
    for (const Entry& e : entries_) {
      if (e.spelling == spelling) return &e;
    }
    return nullptr;
  }
  const std::vector<Entry>& entries() const { return entries_; }
  const std::string& label() const { return label_; }

 private:
  void add(std::string spelling, std::string display, YAML::Node value, std::string where,
           bool from_file);
  void applyOverride(const std::string& text);

  std::string label_;
  std::vector<Entry> entries_;
};

Doc::Doc(std::string_view yaml_text, const std::string& label,
         const std::vector<std::string>& overrides)
    : label_(label) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    throw Error(label + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg,
                "fix the YAML syntax (indentation, ':' after each key)");
  }
  if (!root.IsMap() && !root.IsNull()) {
    throw Error(label + ": a training config must be a mapping of `key: value` lines",
                "start from docs/training_config.md or a LLaMA-Factory example");
  }
  for (const auto& item : root) {
    const std::string key = item.first.Scalar();
    const std::string where = label + ":" + std::to_string(item.first.Mark().line + 1);
    if (key != "kt_config") {
      add(key, key, item.second, where, true);
      continue;
    }
    if (item.second.IsNull()) continue;
    if (!item.second.IsMap()) {
      throw Error(where + ": kt_config must be a block of `key: value` lines",
                  "indent the KTransformers settings under kt_config:");
    }
    for (const auto& inner : item.second) {
      const std::string name = inner.first.Scalar();
      const std::string base = name.starts_with("kt_") ? name.substr(3) : name;
      add("kt_config." + base, "kt_config." + name, inner.second,
          label + ":" + std::to_string(inner.first.Mark().line + 1), true);
    }
  }
  for (const std::string& override_text : overrides) applyOverride(override_text);
}

void Doc::add(std::string spelling, std::string display, YAML::Node value, std::string where,
              bool from_file) {
  const KeySpec* spec = findKey(spelling);
  if (spec == nullptr) failUnknown(spelling, display, where);
  if (from_file && find(spelling) != nullptr) {
    throw Error(where + ": key '" + display + "' appears twice", "keep one of them");
  }
  Entry e{std::move(spelling), std::move(display), std::move(value), std::move(where), spec};
  if (e.value.IsNull()) return;  // `key: null` / `key:` is LLaMA-Factory's "not set"
  if (spec->kind == Kind::Unsupported) {
    const bool off = !spec->off.empty() && e.value.IsScalar() &&
                     (spec->off == "false" ? !boolean(e) : e.value.Scalar() == spec->off);
    if (!off) fail(e, "is not supported by Tandem: " + spec->note, "remove " + e.display);
  }
  if (spec->check != nullptr) spec->check(e);
  entries_.push_back(std::move(e));
}

void Doc::applyOverride(const std::string& text) {
  const std::string where = "command-line override '" + text + "'";
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw Error(where + ": an override must look like key=value", "e.g. learning_rate=1e-4");
  }
  const std::string key = text.substr(0, eq);
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw Error(where + ": the value is not valid YAML: " + e.msg, "quote the value");
  }
  std::string spelling = key;
  if (key.starts_with("kt_config.")) {
    const std::string name = key.substr(10);
    spelling = "kt_config." + (name.starts_with("kt_") ? name.substr(3) : name);
  }
  const KeySpec* spec = findKey(spelling);
  if (spec == nullptr) failUnknown(spelling, key, where);
  // The override replaces every spelling of the same setting (kt_backend vs experts_backend).
  std::vector<Entry> kept;
  for (const Entry& e : entries_) {
    const bool same = e.spelling == spelling || (spec->kind == Kind::Setting &&
                                                 e.spec->kind == Kind::Setting &&
                                                 e.spec->target == spec->target);
    if (!same) kept.push_back(e);
  }
  entries_.swap(kept);
  add(spelling, key, value, where, false);
}

// ---------------------------------------------------------------------------------------------
// Sections. Defaults are the TrainConfig member initializers.

template <class T>
void set(T& field, std::optional<T> value) {
  if (value) field = std::move(*value);
}

void readModel(const Doc& doc, TrainConfig& c) {
  c.model_name_or_path = doc.required("model_name_or_path", text, "/path/to/model");
  if (auto adapter = doc.get("adapter_name_or_path", list)) {
    if (adapter->size() > 1) {
      fail(*doc.find("adapter_name_or_path"), "lists several adapters; Tandem continues one",
           "merge the other adapters into the model first");
    }
    c.adapter_name_or_path = adapter->front();
  }
  set(c.template_name, doc.get("template", text));
  set(c.enable_thinking, doc.get("enable_thinking", boolean));
}

void readMethod(const Doc& doc, TrainConfig& c) {
  if (auto stage = doc.get("stage", text); stage && *stage != "sft") {
    fail(*doc.find("stage"), "'" + *stage + "' is not supported: Tandem does supervised "
                             "fine-tuning only", "set stage: sft");
  }
  if (auto train = doc.get("do_train", boolean); train && !*train) {
    fail(*doc.find("do_train"), "is false, but Tandem's train command always trains",
         "set do_train: true");
  }
  if (auto type = doc.get("finetuning_type", text); type && *type != "lora") {
    fail(*doc.find("finetuning_type"), "'" + *type + "' is not supported: Tandem trains LoRA "
                                       "adapters (the base weights stay frozen)",
         "set finetuning_type: lora");
  }
  set(c.lora_rank, doc.get("lora_rank", positiveInt));
  c.lora_alpha = doc.get("lora_alpha", positiveInt).value_or(2 * c.lora_rank);
  set(c.lora_dropout, doc.get("lora_dropout", unitFraction));
  if (auto target = doc.get("lora_target", list)) {
    if (target->size() > 1 && std::count(target->begin(), target->end(), "all") > 0) {
      fail(*doc.find("lora_target"), "mixes 'all' with module names",
           "use either lora_target: all or a list like q_proj,v_proj");
    }
    c.lora_target = *target;
  }
  set(c.use_rslora, doc.get("use_rslora", boolean));
}

void readData(const Doc& doc, TrainConfig& c) {
  c.dataset = doc.required("dataset", list, "identity,alpaca_en_demo");
  set(c.eval_dataset, doc.get("eval_dataset", list));
  set(c.dataset_dir, doc.get("dataset_dir", text));
  set(c.cutoff_len, doc.get("cutoff_len", positiveInt));
  if (auto n = doc.get("max_samples", positiveInt)) c.max_samples = *n;
  if (auto val = doc.get("val_size", nonNegativeNumber)) {
    if (*val >= 1 && *val != std::floor(*val)) {
      failValue(*doc.find("val_size"), "a fraction in [0, 1) or a whole number of samples");
    }
    c.val_size = *val;
  }
  set(c.train_on_prompt, doc.get("train_on_prompt", boolean));
  set(c.mask_history, doc.get("mask_history", boolean));
  set(c.packing, doc.get("packing", boolean));
}

LrSchedulerType scheduler(const Entry& e) {
  std::string name = oneOf(e, {"linear", "cosine", "constant", "constant_with_warmup"});
  if (name == "cosine") return LrSchedulerType::Cosine;
  if (name == "constant") return LrSchedulerType::Constant;
  if (name == "constant_with_warmup") return LrSchedulerType::ConstantWithWarmup;
  return LrSchedulerType::Linear;
}

int64_t maxSteps(const Entry& e) {
  int64_t value = integer(e, "-1 or a positive integer");
  if (value == 0 || value < -1) failValue(e, "-1 (use num_train_epochs) or a positive integer");
  return value;
}

void readTrain(const Doc& doc, TrainConfig& c) {
  set(c.per_device_train_batch_size, doc.get("per_device_train_batch_size", positiveInt));
  set(c.gradient_accumulation_steps, doc.get("gradient_accumulation_steps", positiveInt));
  set(c.learning_rate, doc.get("learning_rate", positiveNumber));
  set(c.num_train_epochs, doc.get("num_train_epochs", positiveNumber));
  set(c.max_steps, doc.get("max_steps", maxSteps));
  set(c.lr_scheduler_type, doc.get("lr_scheduler_type", scheduler));
  set(c.warmup_ratio, doc.get("warmup_ratio", unitFraction));
  set(c.warmup_steps, doc.get("warmup_steps", nonNegativeInt));
  set(c.max_grad_norm, doc.get("max_grad_norm", nonNegativeNumber));
  set(c.weight_decay, doc.get("weight_decay", nonNegativeNumber));
  set(c.adam_beta1, doc.get("adam_beta1", unitFraction));
  set(c.adam_beta2, doc.get("adam_beta2", unitFraction));
  set(c.adam_epsilon, doc.get("adam_epsilon", positiveNumber));
  set(c.seed, doc.get("seed", nonNegativeInt));
  set(c.bf16, doc.get("bf16", boolean));
  // transformers' AdamW spellings; all are the same AdamW here.
  doc.get("optim", [](const Entry& e) {
    return oneOf(e, {"adamw_torch", "adamw_torch_fused", "adamw_hf"});
  });
  if (auto disable = doc.get("disable_gradient_checkpointing", boolean)) {
    c.gradient_checkpointing = !*disable;
  }
}

EvalStrategy evalStrategy(const Entry& e) {
  std::string name = oneOf(e, {"no", "steps", "epoch"});
  if (name == "steps") return EvalStrategy::Steps;
  return name == "epoch" ? EvalStrategy::Epoch : EvalStrategy::No;
}

std::pair<ResumeFrom, std::filesystem::path> resumeFrom(const Entry& e) {
  bool flag = false;
  if (e.value.IsScalar() && YAML::convert<bool>::decode(e.value, flag)) {
    return {flag ? ResumeFrom::Latest : ResumeFrom::None, {}};
  }
  return {ResumeFrom::Path, text(e)};
}

void readOutput(const Doc& doc, TrainConfig& c) {
  set(c.eval_strategy, doc.get("eval_strategy", evalStrategy));
  if (auto steps = doc.get("eval_steps", positiveInt)) c.eval_steps = *steps;
  set(c.per_device_eval_batch_size, doc.get("per_device_eval_batch_size", positiveInt));
  c.output_dir = doc.required("output_dir", text, "saves/my-run");
  set(c.overwrite_output_dir, doc.get("overwrite_output_dir", boolean));
  set(c.logging_steps, doc.get("logging_steps", positiveInt));
  set(c.save_steps, doc.get("save_steps", positiveInt));
  if (auto limit = doc.get("save_total_limit", positiveInt)) c.save_total_limit = *limit;
  set(c.save_only_model, doc.get("save_only_model", boolean));
  set(c.plot_loss, doc.get("plot_loss", boolean));
  if (auto resume = doc.get("resume_from_checkpoint", resumeFrom)) {
    std::tie(c.resume, c.resume_path) = *resume;
  }
}

int threads(const Entry& e) {
  int64_t value = nonNegativeInt(e);
  if (value > 4096) failValue(e, "a thread count (0 = one per physical core)");
  return static_cast<int>(value);
}

void readTandem(const Doc& doc, TrainConfig& c) {
  set(c.experts_backend, doc.get("experts_backend", expertsBackend));
  set(c.expert_threads, doc.get("expert_threads", threads));
  if (auto rule = doc.get("placement_rule", text)) c.placement_rule = *rule;
  set(c.expert_chunk_tokens, doc.get("expert_chunk_tokens", positiveInt));
  if (auto path = doc.get("expert_weight_path", text)) c.expert_weight_path = *path;
  set(c.device, doc.get("device", device));
  set(c.loss_chunk_tokens, doc.get("loss_chunk_tokens", positiveInt));
}

// Rules that involve several keys (LLaMA-Factory's own checks where it has them).
void checkCombinations(const Doc& doc, const TrainConfig& c) {
  if (c.val_size > 0 && !c.eval_dataset.empty()) {
    fail(*doc.find("val_size"), "cannot be combined with eval_dataset (as in LLaMA-Factory)",
         "use either val_size or eval_dataset");
  }
  if (c.mask_history && c.train_on_prompt) {
    fail(*doc.find("mask_history"), "is incompatible with train_on_prompt (as in LLaMA-Factory)",
         "set one of them to false");
  }
  if (c.eval_strategy != EvalStrategy::No && c.val_size == 0 && c.eval_dataset.empty()) {
    fail(*doc.find("eval_strategy"), "asks for evaluation but there is no eval data",
         "add eval_dataset or val_size, or set eval_strategy: no");
  }
  for (const char* key : {"kt_lora_rank", "kt_config.lora_rank"}) {
    if (const Entry* e = doc.find(key); e != nullptr && positiveInt(*e) != c.lora_rank) {
      fail(*e,
           "(" + shown(e->value) + ") differs from lora_rank (" + std::to_string(c.lora_rank) + ")",
           "set the rank once, with the top-level lora_rank");
    }
  }
  const Entry* disabled = nullptr;
  for (const char* key : {"use_kt", "kt_enabled", "kt_config.enabled"}) {
    if (const Entry* e = doc.find(key); e != nullptr && !boolean(*e)) disabled = e;
  }
  if (disabled == nullptr) return;
  for (const Entry& e : doc.entries()) {
    if (e.spec->kt && e.spelling != "use_kt" && !e.spelling.ends_with("enabled")) {
      fail(e, "is a KTransformers setting, but " + disabled->display + " is false",
           "remove " + disabled->display + ": false (Tandem always runs experts on the CPU) " +
               "or remove " + e.display);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Writing YAML.

// Shortest round-trip form, spelled so PyYAML (YAML 1.1) also reads a float: "1.0e-04", "3.0".
std::string yamlNumber(double value) {
  std::array<char, 64> buffer{};
  auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  std::string s(buffer.data(), end);
  const size_t exponent = s.find('e');
  if (exponent != std::string::npos) {
    if (s.find('.') == std::string::npos) s.insert(exponent, ".0");
  } else if (s.find('.') == std::string::npos) {
    s += ".0";
  }
  return s;
}

std::string yamlString(const std::string& value) {
  YAML::Emitter out;
  out << value;
  return out.c_str();
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

class YamlWriter {
 public:
  void section(const char* title) {
    out_ << (out_.tellp() > 0 ? "\n" : "") << "### " << title << "\n";
  }
  void line(const char* key, const std::string& value) { out_ << key << ": " << value << "\n"; }
  void str(const char* key, const std::string& value) {
    if (!value.empty()) line(key, yamlString(value));
  }
  void flag(const char* key, bool value) { line(key, value ? "true" : "false"); }
  void num(const char* key, double value) { line(key, yamlNumber(value)); }
  void integer(const char* key, int64_t value) { line(key, std::to_string(value)); }
  void integer(const char* key, const std::optional<int64_t>& value) {
    if (value) integer(key, *value);
  }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

}  // namespace

std::string_view lrSchedulerName(LrSchedulerType type) {
  switch (type) {
    case LrSchedulerType::Linear: return "linear";
    case LrSchedulerType::Cosine: return "cosine";
    case LrSchedulerType::Constant: return "constant";
    case LrSchedulerType::ConstantWithWarmup: return "constant_with_warmup";
  }
  return "linear";
}

std::string_view evalStrategyName(EvalStrategy strategy) {
  switch (strategy) {
    case EvalStrategy::No: return "no";
    case EvalStrategy::Steps: return "steps";
    case EvalStrategy::Epoch: return "epoch";
  }
  return "no";
}

TrainConfig parseTrainConfig(std::string_view yaml_text, const std::string& label,
                             const std::vector<std::string>& overrides) {
  const Doc doc(yaml_text, label, overrides);
  TrainConfig config;
  readModel(doc, config);
  readMethod(doc, config);
  readData(doc, config);
  readTrain(doc, config);
  readOutput(doc, config);
  readTandem(doc, config);
  checkCombinations(doc, config);
  return config;
}

TrainConfig loadTrainConfig(const std::filesystem::path& yaml_path,
                            const std::vector<std::string>& overrides) {
  std::ifstream in(yaml_path, std::ios::binary);
  if (!in) {
    throw Error("cannot read the training config " + yaml_path.string(),
                "check the path (LLaMA-Factory examples live in examples/train_lora/)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parseTrainConfig(text.str(), yaml_path.string(), overrides);
}

std::string toYaml(const TrainConfig& c) {
  YamlWriter w;
  w.section("model");
  w.str("model_name_or_path", c.model_name_or_path);
  w.str("adapter_name_or_path", c.adapter_name_or_path);
  w.str("template", c.template_name);
  w.flag("enable_thinking", c.enable_thinking);

  w.section("method");
  w.line("stage", "sft");
  w.flag("do_train", true);
  w.line("finetuning_type", "lora");
  w.integer("lora_rank", c.lora_rank);
  w.integer("lora_alpha", c.lora_alpha);
  w.num("lora_dropout", c.lora_dropout);
  w.str("lora_target", joined(c.lora_target));
  w.flag("use_rslora", c.use_rslora);

  w.section("dataset");
  w.str("dataset", joined(c.dataset));
  w.str("eval_dataset", joined(c.eval_dataset));
  w.str("dataset_dir", c.dataset_dir);
  w.integer("cutoff_len", c.cutoff_len);
  w.integer("max_samples", c.max_samples);
  w.num("val_size", c.val_size);
  w.flag("train_on_prompt", c.train_on_prompt);
  w.flag("mask_history", c.mask_history);
  w.flag("packing", c.packing);

  w.section("output");
  w.str("output_dir", c.output_dir.string());
  w.flag("overwrite_output_dir", c.overwrite_output_dir);
  w.integer("logging_steps", c.logging_steps);
  w.integer("save_steps", c.save_steps);
  w.integer("save_total_limit", c.save_total_limit);
  w.flag("save_only_model", c.save_only_model);
  w.flag("plot_loss", c.plot_loss);
  if (c.resume == ResumeFrom::Latest) w.flag("resume_from_checkpoint", true);
  if (c.resume == ResumeFrom::Path) w.str("resume_from_checkpoint", c.resume_path.string());

  w.section("train");
  w.integer("per_device_train_batch_size", c.per_device_train_batch_size);
  w.integer("gradient_accumulation_steps", c.gradient_accumulation_steps);
  w.num("learning_rate", c.learning_rate);
  w.num("num_train_epochs", c.num_train_epochs);
  w.integer("max_steps", c.max_steps);
  w.line("lr_scheduler_type", std::string(lrSchedulerName(c.lr_scheduler_type)));
  w.num("warmup_ratio", c.warmup_ratio);
  w.integer("warmup_steps", c.warmup_steps);
  w.num("max_grad_norm", c.max_grad_norm);
  w.num("weight_decay", c.weight_decay);
  w.num("adam_beta1", c.adam_beta1);
  w.num("adam_beta2", c.adam_beta2);
  w.num("adam_epsilon", c.adam_epsilon);
  w.integer("seed", c.seed);
  w.flag("bf16", c.bf16);
  w.flag("disable_gradient_checkpointing", !c.gradient_checkpointing);

  w.section("eval");
  // Quoted: YAML 1.1 (PyYAML, hence LLaMA-Factory) reads a bare `no` as false.
  w.line("eval_strategy", "\"" + std::string(evalStrategyName(c.eval_strategy)) + "\"");
  w.integer("eval_steps", c.eval_steps);
  w.integer("per_device_eval_batch_size", c.per_device_eval_batch_size);

  w.section("tandem (CPU expert engine; KTransformers keys map here)");
  w.str("experts_backend", c.experts_backend);
  w.integer("expert_threads", c.expert_threads);
  w.str("placement_rule", c.placement_rule.string());
  w.integer("expert_chunk_tokens", c.expert_chunk_tokens);
  w.str("expert_weight_path", c.expert_weight_path.string());
  w.str("device", c.device);
  w.integer("loss_chunk_tokens", c.loss_chunk_tokens);
  return w.text();
}

std::string configFingerprint(const TrainConfig& config) {
  // Reset what does not change the trained adapter, then hash the canonical text.
  TrainConfig c = config;
  const TrainConfig defaults;
  c.output_dir = defaults.output_dir;
  c.overwrite_output_dir = defaults.overwrite_output_dir;
  c.logging_steps = defaults.logging_steps;
  c.save_steps = defaults.save_steps;
  c.save_total_limit = defaults.save_total_limit;
  c.save_only_model = defaults.save_only_model;
  c.plot_loss = defaults.plot_loss;
  c.resume = defaults.resume;
  c.resume_path = defaults.resume_path;
  c.eval_strategy = defaults.eval_strategy;
  c.eval_steps = defaults.eval_steps;
  c.per_device_eval_batch_size = defaults.per_device_eval_batch_size;
  c.expert_threads = defaults.expert_threads;
  // FNV-1a, 64 bit: this detects "a different config", it is not a security boundary.
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char byte : toYaml(c)) hash = (hash ^ byte) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

}  // namespace tandem::train
