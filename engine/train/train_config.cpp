#include "engine/train/train_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "engine/core/error.h"
#include "engine/core/hash.h"
#include "engine/experts/expert_types.h"
#include "engine/train/train_config_keys.h"

namespace tandem::train {
namespace {

using namespace detail;

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
        fail(e,
             "('" + shown(e.value) + "') conflicts with " + first->display + " ('" +
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
    const bool same =
        e.spelling == spelling || (spec->kind == Kind::Setting && e.spec->kind == Kind::Setting &&
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

// Upper bounds: past them a value is a typo or an overflow waiting to happen (1e300 epochs is
// no step count a 64-bit counter holds), never a run anyone means.
constexpr int64_t kMaxCount = 1'000'000'000'000;  // steps, samples: a trillion
constexpr int64_t kMaxBatch = 65'536;             // sequences per micro-batch
constexpr int64_t kMaxTokens = 16'777'216;        // cutoff_len, chunk sizes: 16 Mi tokens
constexpr int64_t kMaxRank = 65'536;              // lora_rank, lora_alpha
constexpr double kMaxEpochs = 1e6;
constexpr double kMaxLearningRate = 10;  // AdamW: 1e-6 to 1e-2 in practice
constexpr double kMaxGradNorm = 1e6;
// ddp_timeout, seconds: LLaMA-Factory's default of 180000000 fits.
constexpr int64_t kMaxDdpTimeout = 1'000'000'000;
constexpr double kMaxWeightDecay = 1e3;

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
    fail(*doc.find("stage"),
         "'" + *stage +
             "' is not supported: Tandem does supervised "
             "fine-tuning only",
         "set stage: sft");
  }
  if (auto train = doc.get("do_train", boolean); train && !*train) {
    fail(*doc.find("do_train"), "is false, but Tandem's train command always trains",
         "set do_train: true");
  }
  if (auto type = doc.get("finetuning_type", text); type && *type != "lora") {
    fail(*doc.find("finetuning_type"),
         "'" + *type +
             "' is not supported: Tandem trains LoRA "
             "adapters (the base weights stay frozen)",
         "set finetuning_type: lora");
  }
  set(c.lora_rank, doc.get("lora_rank", PositiveIntUpTo{kMaxRank}));
  c.lora_alpha = doc.get("lora_alpha", PositiveIntUpTo{kMaxRank}).value_or(2 * c.lora_rank);
  set(c.lora_dropout, doc.get("lora_dropout", unitFraction));
  if (auto target = doc.get("lora_target", list)) {
    if (target->size() > 1 && std::count(target->begin(), target->end(), "all") > 0) {
      fail(*doc.find("lora_target"), "mixes 'all' with module names",
           "use either lora_target: all or a list like q_proj,v_proj");
    }
    c.lora_target = *target;
  }
  set(c.use_rslora, doc.get("use_rslora", boolean));
  set(c.lora_experts, doc.get("lora_experts", loraExperts));
  set(c.le_dim, doc.get("le_dim", PositiveIntUpTo{kMaxRank}));
}

void readData(const Doc& doc, TrainConfig& c) {
  c.dataset = doc.required("dataset", list, "identity,alpaca_en_demo");
  set(c.eval_dataset, doc.get("eval_dataset", list));
  set(c.dataset_dir, doc.get("dataset_dir", text));
  set(c.cutoff_len, doc.get("cutoff_len", PositiveIntUpTo{kMaxTokens}));
  if (auto n = doc.get("max_samples", PositiveIntUpTo{kMaxCount})) c.max_samples = *n;
  if (auto val = doc.get("val_size", NonNegativeNumberUpTo{static_cast<double>(kMaxCount)})) {
    if (*val >= 1 && *val != std::floor(*val)) {
      failValue(*doc.find("val_size"), "a fraction in [0, 1) or a whole number of samples");
    }
    c.val_size = *val;
  }
  set(c.train_on_prompt, doc.get("train_on_prompt", boolean));
  set(c.mask_history, doc.get("mask_history", boolean));
  set(c.packing, doc.get("packing", boolean));
  set(c.neat_packing, doc.get("neat_packing", boolean));
  // LLaMA-Factory's DataArguments: neat_packing forces packing (it warns when packing: false).
  if (c.neat_packing) c.packing = true;
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
  if (value > kMaxCount)
    failValue(e, "-1 or a positive integer up to " + boundText(static_cast<double>(kMaxCount)));
  return value;
}

void readTrain(const Doc& doc, TrainConfig& c) {
  set(c.per_device_train_batch_size,
      doc.get("per_device_train_batch_size", PositiveIntUpTo{kMaxBatch}));
  set(c.gradient_accumulation_steps,
      doc.get("gradient_accumulation_steps", PositiveIntUpTo{kMaxBatch}));
  set(c.learning_rate, doc.get("learning_rate", PositiveNumberUpTo{kMaxLearningRate}));
  set(c.num_train_epochs, doc.get("num_train_epochs", PositiveNumberUpTo{kMaxEpochs}));
  set(c.max_steps, doc.get("max_steps", maxSteps));
  set(c.lr_scheduler_type, doc.get("lr_scheduler_type", scheduler));
  set(c.warmup_ratio, doc.get("warmup_ratio", unitFraction));
  set(c.warmup_steps, doc.get("warmup_steps", NonNegativeIntUpTo{kMaxCount}));
  set(c.max_grad_norm, doc.get("max_grad_norm", NonNegativeNumberUpTo{kMaxGradNorm}));
  set(c.weight_decay, doc.get("weight_decay", NonNegativeNumberUpTo{kMaxWeightDecay}));
  set(c.adam_beta1, doc.get("adam_beta1", unitFraction));
  set(c.adam_beta2, doc.get("adam_beta2", unitFraction));
  set(c.adam_epsilon, doc.get("adam_epsilon", PositiveNumberUpTo{1.0}));
  set(c.seed, doc.get("seed", NonNegativeIntUpTo{4294967295}));
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
  if (auto steps = doc.get("eval_steps", PositiveIntUpTo{kMaxCount})) c.eval_steps = *steps;
  set(c.per_device_eval_batch_size,
      doc.get("per_device_eval_batch_size", PositiveIntUpTo{kMaxBatch}));
  c.output_dir = doc.required("output_dir", text, "saves/my-run");
  set(c.overwrite_output_dir, doc.get("overwrite_output_dir", boolean));
  set(c.logging_steps, doc.get("logging_steps", PositiveIntUpTo{kMaxCount}));
  set(c.save_steps, doc.get("save_steps", PositiveIntUpTo{kMaxCount}));
  if (auto limit = doc.get("save_total_limit", PositiveIntUpTo{kMaxCount}))
    c.save_total_limit = *limit;
  set(c.save_only_model, doc.get("save_only_model", boolean));
  set(c.plot_loss, doc.get("plot_loss", boolean));
  set(c.ddp_timeout, doc.get("ddp_timeout", PositiveIntUpTo{kMaxDdpTimeout}));
  if (auto resume = doc.get("resume_from_checkpoint", resumeFrom)) {
    std::tie(c.resume, c.resume_path) = *resume;
  }
}

int threads(const Entry& e) {
  int64_t value = nonNegativeInt(e);
  if (value > 4096) failValue(e, "a thread count (0 = one per physical core)");
  return static_cast<int>(value);
}

std::string expertsMode(const Entry& e) {
  std::string value = text(e);
  if (value != "auto" && value != "cpu" && value != "gpu-offload")
    failValue(e, "auto, cpu or gpu-offload");
  return value;
}

std::string taskSplit(const Entry& e) { return oneOf(e, {"auto", "rows", "columns"}); }

// experts_int4_group / experts_int4_symmetric fold into experts_format ("int4:g64:asym"), the one
// string ModelRequest carries to the expert engine (experts::parseWeightFormat).
void readInt4Options(const Doc& doc, TrainConfig& c) {
  const std::optional<std::string> group = doc.get("experts_int4_group", int4Group);
  const std::optional<bool> symmetric = doc.get("experts_int4_symmetric", boolean);
  if (!group && !symmetric) return;
  experts::Int4Spec spec;
  if (c.experts_format.rfind("int4", 0) != 0 ||
      experts::parseWeightFormat(c.experts_format, &spec) != experts::WeightFormat::Int4) {
    throw Error(
        "experts_int4_group and experts_int4_symmetric describe int4 experts, but "
        "experts_format is " +
            c.experts_format,
        "set experts_format: int4 (or remove the int4 keys)");
  }
  if (group) spec.group = std::stoi(*group);
  if (symmetric) spec.symmetric = *symmetric;
  c.experts_format = experts::int4FormatName(spec);
}

// Issue 29's long-sequence keys (docs/long_context.md).
void readLongContext(const Doc& doc, TrainConfig& c) {
  set(c.offload_checkpoints, doc.get("offload_checkpoints", boolean));
  set(c.moe_token_chunk, doc.get("moe_token_chunk", NonNegativeIntUpTo{kMaxTokens}));
}

// experts_mode: auto's policy and how often its resident cache is re-placed (micro-batches).
void readExpertSplit(const Doc& doc, TrainConfig& c) {
  set(c.expert_split, doc.get("expert_split", [](const Entry& e) {
    return oneOf(e, {"balance", "cycle"});
  }));
  set(c.resident_refresh_steps, doc.get("resident_refresh_steps", nonNegativeInt));
}

void readTandem(const Doc& doc, TrainConfig& c) {
  set(c.experts_backend, doc.get("experts_backend", expertsBackend));
  set(c.expert_threads, doc.get("expert_threads", threads));
  if (auto rule = doc.get("placement_rule", text)) c.placement_rule = *rule;
  set(c.expert_chunk_tokens, doc.get("expert_chunk_tokens", PositiveIntUpTo{kMaxTokens}));
  if (auto path = doc.get("expert_weight_path", text)) c.expert_weight_path = *path;
  set(c.device, doc.get("device", device));
  if (auto devices = doc.get("layer_devices", text)) c.layer_devices = *devices;
  set(c.experts_mode, doc.get("experts_mode", expertsMode));
  set(c.loss_chunk_tokens, doc.get("loss_chunk_tokens", PositiveIntUpTo{kMaxTokens}));
  set(c.experts_format, doc.get("experts_format", expertsFormat));
  readInt4Options(doc, c);
  set(c.experts_wt_policy, doc.get("experts_wt_policy", expertsWtPolicy));
  set(c.gpu_experts, doc.get("gpu_experts", gpuExperts));
  set(c.task_split, doc.get("task_split", taskSplit));
  readLongContext(doc, c);
  readExpertSplit(doc, c);
}

// The expert backends compute in one format each (engine/experts kernels): amx_int8 in int8;
// amx_bf16, avx512_bf16 and onednn in bf16 (fp8 checkpoints are dequantised into bf16 packs).
void checkExpertsFormat(const Doc& doc, const TrainConfig& c) {
  if (c.experts_format == "auto") return;
  const std::string& b = c.experts_backend;
  const bool int8_only = b == "amx_int8";
  const bool bf16_only = b == "amx_bf16" || b == "avx512_bf16" || b == "onednn";
  // int4 and GGUF blocks are multiplied on their blocks by the fp32 backends (auto, avx512, avx2,
  // generic), which decode tiles of them.
  const bool on_blocks = c.experts_format.rfind("int4", 0) == 0 || c.experts_format == "blocks";
  if (on_blocks && (int8_only || bf16_only)) {
    const Entry* format = nullptr;
    for (const Entry& e : doc.entries()) {
      if (e.spec->kind == Kind::Setting && e.spec->target == "experts_format") format = &e;
    }
    fail(*format, "('" + c.experts_format + "') cannot be computed by experts_backend " + b,
         "int4 and blocks run on experts_backend auto, avx512, avx2 or generic");
  }
  if ((int8_only && c.experts_format != "int8") || (bf16_only && c.experts_format == "int8")) {
    const Entry* format = nullptr;
    for (const Entry& e : doc.entries()) {
      if (e.spec->kind == Kind::Setting && e.spec->target == "experts_format") format = &e;
    }
    fail(*format,
         "('" + c.experts_format + "') cannot be computed by experts_backend " + b +
             (int8_only ? ", which multiplies int8 weights only"
                        : ", which multiplies bf16 weights only"),
         int8_only
             ? "set experts_format: int8 (or auto), or choose another backend"
             : "set experts_format: bf16 (or auto), or experts_backend: amx_int8 / auto for int8");
  }
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
  if (c.packing && c.cutoff_len < 2) {
    fail(*doc.find(c.neat_packing ? "neat_packing" : "packing"),
         "needs cutoff_len >= 2: a packed row holds cutoff_len - 1 tokens (as in LLaMA-Factory)",
         "raise cutoff_len, or turn packing off");
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
  checkExpertsFormat(doc, config);
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
  if (c.lora_experts != "0") {  // absent when off: the fingerprints of runs without LE stay
    w.str("lora_experts", c.lora_experts);
    w.integer("le_dim", c.le_dim);
  }

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
  if (c.neat_packing) w.flag("neat_packing", true);  // absent when off: fingerprints stay

  w.section("output");
  w.str("output_dir", c.output_dir.string());
  w.flag("overwrite_output_dir", c.overwrite_output_dir);
  w.integer("logging_steps", c.logging_steps);
  w.integer("save_steps", c.save_steps);
  w.integer("save_total_limit", c.save_total_limit);
  w.flag("save_only_model", c.save_only_model);
  w.flag("plot_loss", c.plot_loss);
  w.integer("ddp_timeout", c.ddp_timeout);
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
  w.str("layer_devices", c.layer_devices);
  w.str("experts_mode", c.experts_mode);
  w.integer("loss_chunk_tokens", c.loss_chunk_tokens);
  w.str("experts_format", c.experts_format);
  w.str("experts_wt_policy", c.experts_wt_policy);
  w.str("gpu_experts", c.gpu_experts);
  w.str("task_split", c.task_split);
  // Written only when set: the text of every earlier config, hence its fingerprint (which
  // checkpoints carry for resume), stays what it was.
  if (c.offload_checkpoints) w.flag("offload_checkpoints", true);
  if (c.moe_token_chunk != 0) w.integer("moe_token_chunk", c.moe_token_chunk);
  // Only when set: configs written before these keys keep their text (and fingerprint).
  const TrainConfig defaults;
  if (c.expert_split != defaults.expert_split) w.str("expert_split", c.expert_split);
  if (c.resident_refresh_steps != defaults.resident_refresh_steps)
    w.integer("resident_refresh_steps", c.resident_refresh_steps);
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
  c.ddp_timeout = defaults.ddp_timeout;
  c.resume = defaults.resume;
  c.resume_path = defaults.resume_path;
  c.eval_strategy = defaults.eval_strategy;
  c.eval_steps = defaults.eval_steps;
  c.per_device_eval_batch_size = defaults.per_device_eval_batch_size;
  c.expert_threads = defaults.expert_threads;
  // Where and in what pieces the same math runs: what a user changes after an out-of-memory
  // stop (checkpointing on, layers moved, experts offloaded, smaller chunks) and then resumes.
  c.experts_wt_policy = defaults.experts_wt_policy;
  c.gpu_experts = defaults.gpu_experts;
  c.gradient_checkpointing = defaults.gradient_checkpointing;
  c.device = defaults.device;
  c.layer_devices = defaults.layer_devices;
  c.experts_mode = defaults.experts_mode;
  c.loss_chunk_tokens = defaults.loss_chunk_tokens;
  c.expert_chunk_tokens = defaults.expert_chunk_tokens;
  c.task_split = defaults.task_split;  // rows and columns give bitwise the same results
  // Where the checkpoints wait and how many tokens the MoE block takes at once: the same math.
  c.offload_checkpoints = defaults.offload_checkpoints;
  c.moe_token_chunk = defaults.moe_token_chunk;
  c.expert_split = defaults.expert_split;  // any split gives the same numbers
  c.resident_refresh_steps = defaults.resident_refresh_steps;
  // Detects "a different config"; not a security boundary.
  Fnv1a64 hash;
  hash.add(toYaml(c));
  return hash.hex();
}

}  // namespace tandem::train
