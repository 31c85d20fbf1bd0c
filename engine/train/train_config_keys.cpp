#include "engine/train/train_config_keys.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>

#include "engine/core/error.h"
#include "engine/experts/expert_types.h"

namespace tandem::train::detail {

std::string shown(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

[[noreturn]] void fail(const Entry& e, const std::string& problem, std::string what_to_do) {
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

// ---------------------------------------------------------------------------------------------
// The key table.

namespace {

void checkReportTo(const Entry& e);
void checkUseKt(const Entry& e);
void checkPositiveInt(const Entry& e);

const std::string kGc =
    "LLaMA-Factory controls it with disable_gradient_checkpointing "
    "(default false = checkpointing on); use that key";

void addSettingKeys(std::vector<KeySpec>& keys) {
  auto setting = [&](std::string name) { keys.push_back({name, Kind::Setting, name}); };
  for (const char* name : {"model_name_or_path",
                           "adapter_name_or_path",
                           "template",
                           "enable_thinking",
                           "stage",
                           "do_train",
                           "finetuning_type",
                           "lora_rank",
                           "lora_alpha",
                           "lora_dropout",
                           "lora_target",
                           "use_rslora",
                           "lora_experts",
                           "le_dim",
                           "dataset",
                           "eval_dataset",
                           "dataset_dir",
                           "cutoff_len",
                           "max_samples",
                           "val_size",
                           "train_on_prompt",
                           "mask_history",
                           "packing",
                           "neat_packing",
                           "per_device_train_batch_size",
                           "gradient_accumulation_steps",
                           "learning_rate",
                           "num_train_epochs",
                           "max_steps",
                           "lr_scheduler_type",
                           "warmup_ratio",
                           "warmup_steps",
                           "max_grad_norm",
                           "weight_decay",
                           "adam_beta1",
                           "adam_beta2",
                           "adam_epsilon",
                           "seed",
                           "bf16",
                           "optim",
                           "disable_gradient_checkpointing",
                           "eval_strategy",
                           "eval_steps",
                           "per_device_eval_batch_size",
                           "output_dir",
                           "overwrite_output_dir",
                           "logging_steps",
                           "save_steps",
                           "save_total_limit",
                           "save_only_model",
                           "plot_loss",
                           "resume_from_checkpoint",
                           "experts_backend",
                           "expert_threads",
                           "placement_rule",
                           "expert_chunk_tokens",
                           "expert_weight_path",
                           "device",
                           "layer_devices",
                           "experts_mode",
                           "loss_chunk_tokens",
                           "experts_format",
                           "experts_int4_group",
                           "experts_int4_symmetric",
                           "experts_wt_policy",
                           "gpu_experts",
                           "task_split",
                           "offload_checkpoints",
                           "moe_token_chunk",
                           "ddp_timeout"}) {
    setting(name);
  }
  // experts_mode: auto's split (engine/model/split_experts.h).
  for (const char* name : {"expert_split", "resident_refresh_steps"}) setting(name);
  for (const char* name :
       {"trust_remote_code", "flash_attn", "preprocessing_num_workers", "overwrite_cache",
        "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
        "do_eval", "use_fast_tokenizer", "low_cpu_mem_usage", "run_name", "logging_dir",
        "print_param_status", "cache_dir"}) {
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
  struct KtKey {
    const char* name;
    Kind kind;
    const char* target;
    CheckFn check;
  };
  const KtKey kt_keys[] = {
      {"backend", Kind::Setting, "experts_backend", nullptr},
      {"method", Kind::Setting, "experts_backend", nullptr},
      {"num_threads", Kind::Setting, "expert_threads", nullptr},
      {"optimize_rule", Kind::Setting, "placement_rule", nullptr},
      {"chunk_size", Kind::Setting, "expert_chunk_tokens", nullptr},
      {"weight_path", Kind::Setting, "expert_weight_path", nullptr},
      {"expert_weight_format", Kind::Setting, "experts_format", nullptr},
      {"num_gpu_experts", Kind::Setting, "gpu_experts", nullptr},
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
    keys.push_back({prefix + "non_expert_weight_path",
                    Kind::Unsupported,
                    {},
                    "Tandem reads the non-expert weights from model_name_or_path",
                    {},
                    true});
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
  for (const char* name : {"use_unsloth",
                           "use_unsloth_gc",
                           "enable_liger_kernel",
                           "shift_attn",
                           "use_dora",
                           "pissa_init",
                           "pissa_convert",
                           "create_new_adapter",
                           "use_galore",
                           "use_apollo",
                           "use_badam",
                           "use_adam_mini",
                           "use_muon",
                           "use_llama_pro",
                           "upcast_layernorm",
                           "upcast_lmhead_output",
                           "resize_vocab",
                           "train_from_scratch",
                           "torch_compile",
                           "do_predict",
                           "predict_with_generate",
                           "compute_accuracy"}) {
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

}  // namespace

const KeySpec* findKey(std::string_view spelling) {
  for (const KeySpec& spec : keyTable()) {
    if (spec.spelling == spelling) return &spec;
  }
  return nullptr;
}

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

namespace {

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

}  // namespace

int64_t integer(const Entry& e, const char* expected) {
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

double number(const Entry& e, const char* expected) {
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

double unitFraction(const Entry& e) {
  double value = number(e, "a number in [0, 1)");
  if (value < 0 || value >= 1) failValue(e, "a number in [0, 1)");
  return value;
}

std::string boundText(double value) {
  char text[32];
  std::snprintf(text, sizeof text, value == std::floor(value) && value < 1e15 ? "%.0f" : "%g",
                value);
  return text;
}

int64_t PositiveIntUpTo::operator()(const Entry& e) const {
  const int64_t v = positiveInt(e);
  if (v > hi) failValue(e, "a positive integer up to " + boundText(static_cast<double>(hi)));
  return v;
}

int64_t NonNegativeIntUpTo::operator()(const Entry& e) const {
  const int64_t v = nonNegativeInt(e);
  if (v > hi) failValue(e, "an integer in [0, " + boundText(static_cast<double>(hi)) + "]");
  return v;
}

double PositiveNumberUpTo::operator()(const Entry& e) const {
  const double v = positiveNumber(e);
  if (v > hi) failValue(e, "a positive number up to " + boundText(hi));
  return v;
}

double NonNegativeNumberUpTo::operator()(const Entry& e) const {
  const double v = nonNegativeNumber(e);
  if (v > hi) failValue(e, "a number in [0, " + boundText(hi) + "]");
  return v;
}

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

namespace {

std::string lowered(std::string s) {
  std::string out;
  for (char c : s) {
    if (c != '_' && c != '-') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

constexpr std::string_view kBackends =
    "auto, generic, avx2, avx512, avx512_bf16, amx_bf16, amx_int8, onednn";

}  // namespace

std::string expertsBackend(const Entry& e) {
  static const std::map<std::string, std::string> names = {
      {"auto", "auto"},
      {"generic", "generic"},
      {"avx512", "avx512"},
      {"avx2", "avx2"},
      {"avx512bf16", "avx512_bf16"},
      {"amxbf16", "amx_bf16"},
      {"amxint8", "amx_int8"},
      {"onednn", "onednn"},
      // KT's llamafile kernels are its default CPU path, vectorised for whatever the CPU has:
      // Tandem's best kernels for the CPU, as a rule file's llamafile means (kt_rules.cpp).
      {"llamafile", "auto"}};
  const std::string key = lowered(text(e));
  if (auto it = names.find(key); it != names.end()) return it->second;
  static const std::array<std::string_view, 11> kt_only = {
      "amxint4", "rawint4", "gptqint4", "fp8",       "fp8perchannel", "mxfp4",
      "moeint8", "moeint4", "bf16",     "torchbf16", "armbf16"};
  if (std::find(kt_only.begin(), kt_only.end(), key) != kt_only.end()) {
    fail(e, "'" + text(e) + "' is a KTransformers backend Tandem does not have",
         "use one of " + std::string(kBackends) +
             " (Tandem reads bf16/fp16/fp32 experts and DeepSeek-V3-style fp8 ones; the format is "
             "experts_format: auto|bf16|int8|int4|fp8|blocks)");
  }
  fail(e, "must be one of " + std::string(kBackends) +
              " (or a KTransformers name: AMXBF16, "
              "AMXInt8, llamafile); got '" +
              text(e) + "'");
}

std::string expertsFormat(const Entry& e) {
  const std::string value = lowered(text(e));
  for (const char* name : {"auto", "bf16", "int8", "fp8", "int4", "blocks"}) {
    if (value == name) return value;
  }
  // int4 with its options composed in (a saved config: experts_int4_group / _symmetric folded in)
  experts::Int4Spec spec;
  if (value.rfind("int4:", 0) == 0) {
    try {
      if (experts::parseWeightFormat(value, &spec) == experts::WeightFormat::Int4) return value;
    } catch (const Error&) {
    }
  }
  if (value == "mxfp4" || value == "legacyint") {
    fail(e, "'" + text(e) + "' is a KTransformers expert format Tandem does not have",
         "use auto, bf16, int8, int4, fp8 or blocks (docs/experts.md)");
  }
  fail(e, "must be one of auto, bf16, int8, int4, fp8, blocks; got '" + text(e) + "'");
}

std::string int4Group(const Entry& e) { return oneOf(e, {"32", "64", "128"}); }

std::string gpuExperts(const Entry& e) {
  const std::string value = lowered(text(e));
  if (value == "auto") return value;
  if (value.empty() ||
      !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    failValue(e, "auto or a count >= 0 (routed experts per MoE layer on its GPU)");
  }
  const int64_t count = nonNegativeInt(e);
  if (count > (int64_t{1} << 20)) {
    failValue(e, "auto or a count in [0, 1048576] (routed experts per MoE layer on its GPU)");
  }
  return std::to_string(count);
}

std::string loraExperts(const Entry& e) {
  const std::string value = lowered(text(e));
  if (value == "auto") return value;
  constexpr const char* kExpected = "auto or a count in [0, 64] (LoRA-expert paths per MoE layer)";
  if (value.empty() ||
      !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      value.size() > 2 || nonNegativeInt(e) > 64) {
    failValue(e, kExpected);
  }
  return std::to_string(nonNegativeInt(e));
}

std::string expertsWtPolicy(const Entry& e) {
  const std::string value = text(e);
  if (value == "auto" || value == "persistent" || value == "on_demand" || value == "background")
    return value;
  fail(e, "must be one of auto, persistent, on_demand, background; got '" + value + "'");
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

namespace {

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

}  // namespace

}  // namespace tandem::train::detail
