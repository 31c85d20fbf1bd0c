#include "engine/io/model_config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/io/bounded_json.h"

namespace tandem::io {
namespace {

using Json = nlohmann::json;

constexpr std::array<std::string_view, 8> kModelTypes = {
    "qwen3_moe", "qwen2_moe", "deepseek_v2", "deepseek_v3", "mixtral", "llama", "qwen2", "qwen3"};
constexpr std::array<std::string_view, 6> kRopeTypes = {"default", "linear",   "dynamic",
                                                        "yarn",    "longrope", "llama3"};

// A value of the file, cut for an error message.
std::string shown(const Json& value) { return excerptForMessage(value.dump()); }

std::string joined(std::span<const std::string_view> items) {
  std::string out;
  for (std::string_view item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// Typed access to one JSON object of config.json. Every error names the file and the field, with
// `prefix` giving the path of nested objects ("rope_scaling.").
class Fields {
 public:
  Fields(const Json& object, const std::string& label, std::string prefix = {})
      : object_(object), label_(label), prefix_(std::move(prefix)) {}

  // JSON null counts as absent: transformers 5 writes e.g. "head_dim": null, "q_lora_rank": null.
  bool has(const char* key) const {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }
  const Json* get(const char* key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  [[noreturn]] void fail(const char* key, const std::string& problem,
                         const std::string& what_to_do = {}) const {
    throw Error(label_ + ": field '" + prefix_ + key + "' " + problem,
                what_to_do.empty()
                    ? "fix " + label_ + " (compare with the model's published config.json)"
                    : what_to_do);
  }

  std::optional<int64_t> optInt(const char* key) const {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (value->is_number_integer()) return value->get<int64_t>();
    // 4096.0 is an integer too; some exporters write floats.
    // (Converting a double outside int64's range is undefined: those are not integers here.)
    if (value->is_number_float()) {
      const double d = value->get<double>();
      if (std::abs(d) < 0x1p62 && d == std::trunc(d)) return static_cast<int64_t>(d);
    }
    fail(key, "must be an integer, got " + shown(*value));
  }
  int64_t requiredInt(const char* key) const {
    std::optional<int64_t> value = optInt(key);
    if (!value) fail(key, "is missing (required)");
    return *value;
  }
  int64_t positive(const char* key, std::optional<int64_t> value) const {
    if (!value || *value <= 0) {
      const Json* raw = get(key);
      fail(key, "must be a positive integer, got " + (raw ? shown(*raw) : std::string("nothing")));
    }
    return *value;
  }
  int64_t requiredPositive(const char* key) const { return positive(key, requiredInt(key)); }
  int64_t positiveOr(const char* key, int64_t fallback) const {
    return has(key) ? positive(key, optInt(key)) : fallback;
  }
  int64_t nonNegativeOr(const char* key, int64_t fallback) const {
    std::optional<int64_t> value = optInt(key);
    if (value && *value < 0) fail(key, "must not be negative, got " + shown(*get(key)));
    return value.value_or(fallback);
  }

  std::optional<double> optNumber(const char* key) const {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number()) fail(key, "must be a number, got " + shown(*value));
    return value->get<double>();
  }
  double numberOr(const char* key, double fallback) const {
    return optNumber(key).value_or(fallback);
  }

  bool boolOr(const char* key, bool fallback) const {
    const Json* value = get(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) fail(key, "must be true or false, got " + shown(*value));
    return value->get<bool>();
  }

  std::optional<std::string> optString(const char* key) const {
    const Json* value = get(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) fail(key, "must be a string, got " + shown(*value));
    return value->get<std::string>();
  }

  std::vector<int64_t> intList(const char* key) const {
    std::vector<int64_t> out;
    const Json* value = get(key);
    if (value == nullptr) return out;
    if (!value->is_array()) fail(key, "must be a list of integers, got " + shown(*value));
    for (const Json& item : *value) {
      if (!item.is_number_integer()) fail(key, "must be a list of integers, got " + shown(*value));
      out.push_back(item.get<int64_t>());
    }
    return out;
  }

  const Json* optObject(const char* key) const {
    const Json* value = get(key);
    if (value != nullptr && !value->is_object())
      fail(key, "must be an object, got " + shown(*value));
    return value;
  }

  const std::string& label() const { return label_; }

 private:
  const Json& object_;
  const std::string& label_;
  std::string prefix_;
};

Architecture parseArchitecture(const Fields& fields) {
  std::optional<std::string> model_type = fields.optString("model_type");
  if (!model_type) {
    fields.fail("model_type", "is missing (required)",
                "this does not look like a Hugging Face config.json of a causal LM");
  }
  for (size_t i = 0; i < kModelTypes.size(); ++i) {
    if (*model_type == kModelTypes[i]) return static_cast<Architecture>(i);
  }
  // Kimi-K2 is DeepSeek-V3's architecture (DeepseekV3ForCausalLM) under its own model_type,
  // set so engines can tell them apart; vLLM and SGLang read it as deepseek_v3 too.
  if (*model_type == "kimi_k2") return Architecture::DeepseekV3;
  fields.fail("model_type",
              "is \"" + excerptForMessage(*model_type) + "\", which Tandem does not support",
              "supported model types: " + joined(kModelTypes));
}

RopeType parseRopeType(const Fields& fields, const char* key, const std::string& name) {
  for (size_t i = 0; i < kRopeTypes.size(); ++i) {
    if (name == kRopeTypes[i]) return static_cast<RopeType>(i);
  }
  fields.fail(key, "is \"" + excerptForMessage(name) + "\", an unknown rope type",
              "known rope types: " + joined(kRopeTypes));
}

// Rope: transformers 5 "rope_parameters" wins over the classic "rope_scaling" + "rope_theta".
void readRope(const Fields& top, ModelConfig& config) {
  const char* object_key = top.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  config.rope_theta = top.numberOr("rope_theta", config.rope_theta);
  const Json* object = top.optObject(object_key);
  if (object == nullptr) return;
  Fields rope(*object, top.label(), std::string(object_key) + ".");
  config.rope_theta = rope.numberOr("rope_theta", config.rope_theta);
  // DeepSeek's published configs say "type"; transformers writes "rope_type" (and keeps "type").
  const char* type_key = rope.has("rope_type") ? "rope_type" : "type";
  std::string type_name = rope.optString(type_key).value_or("default");
  RopeScaling& s = config.rope;
  s.type = parseRopeType(rope, type_key, type_name);
  s.factor = rope.numberOr("factor", 1.0);
  s.original_max_position_embeddings = rope.optInt("original_max_position_embeddings");
  s.attention_factor = rope.optNumber("attention_factor");
  s.beta_fast = rope.optNumber("beta_fast");
  s.beta_slow = rope.optNumber("beta_slow");
  s.mscale = rope.optNumber("mscale");
  s.mscale_all_dim = rope.optNumber("mscale_all_dim");
  s.low_freq_factor = rope.optNumber("low_freq_factor");
  s.high_freq_factor = rope.optNumber("high_freq_factor");
  if (s.type != RopeType::Default && s.factor <= 0) rope.fail("factor", "must be positive");
  if (s.type == RopeType::Llama3 &&
      (!s.low_freq_factor || !s.high_freq_factor || !s.original_max_position_embeddings)) {
    rope.fail(type_key,
              "is llama3, which needs low_freq_factor, high_freq_factor and "
              "original_max_position_embeddings");
  }
}

void readQuantization(const Fields& top, ModelConfig& config) {
  const Json* object = top.optObject("quantization_config");
  if (object == nullptr) return;
  Fields q(*object, top.label(), "quantization_config.");
  QuantizationConfig quant;
  std::optional<std::string> method = q.optString("quant_method");
  if (!method) q.fail("quant_method", "is missing (required)");
  quant.quant_method = *method;
  quant.fmt = q.optString("fmt").value_or("");
  quant.activation_scheme = q.optString("activation_scheme").value_or("");
  quant.weight_block_size = q.intList("weight_block_size");
  quant.format = q.optString("format").value_or("");
  if (const Json* groups = q.optObject("config_groups"); groups != nullptr && !groups->empty()) {
    const auto first = groups->begin();
    if (!first->is_object()) q.fail("config_groups", "must hold objects");
    Fields group(*first, top.label(), "quantization_config.config_groups." + first.key() + ".");
    if (const Json* weights = group.optObject("weights"); weights != nullptr) {
      Fields w(*weights, top.label(),
               "quantization_config.config_groups." + first.key() + ".weights.");
      quant.weight_bits = w.optInt("num_bits").value_or(0);
      quant.weight_group_size = w.optInt("group_size").value_or(0);
      quant.weight_symmetric = w.boolOr("symmetric", true);
    }
  }
  // Kimi-K2's native int4 experts are held as stored (group 32 with a 16-bit scale is Tandem's
  // `int4`); other compressed-tensors schemes are refused when the weights are loaded.
  if (quant.quant_method == "compressed-tensors" && quant.format == "pack-quantized" &&
      quant.weight_bits == 4 && quant.weight_group_size == 32 && quant.weight_symmetric) {
    config.stored_expert_format = "int4";
  }
  config.quantization = std::move(quant);
}

int asInt(const Fields& fields, const char* key, int64_t value) {
  if (value > INT32_MAX) fields.fail(key, "is too large (" + std::to_string(value) + ")");
  return static_cast<int>(value);
}

void readBody(const Fields& f, ModelConfig& c) {
  const bool mla = c.isMla();
  c.hidden_size = f.requiredPositive("hidden_size");
  c.intermediate_size = f.requiredPositive("intermediate_size");
  c.num_hidden_layers = asInt(f, "num_hidden_layers", f.requiredPositive("num_hidden_layers"));
  c.num_attention_heads =
      asInt(f, "num_attention_heads", f.requiredPositive("num_attention_heads"));
  c.num_key_value_heads =
      asInt(f, "num_key_value_heads", f.positiveOr("num_key_value_heads", c.num_attention_heads));
  c.vocab_size = f.requiredPositive("vocab_size");
  c.max_position_embeddings = f.positiveOr("max_position_embeddings", 2048);
  c.rms_norm_eps =
      f.numberOr("rms_norm_eps", c.architecture == Architecture::Mixtral ? 1e-5 : 1e-6);
  if (c.rms_norm_eps <= 0) f.fail("rms_norm_eps", "must be positive");
  c.rope_theta = c.architecture == Architecture::Mixtral ? 1e6 : 10000.0;
  readRope(f, c);
  if (c.rope_theta <= 0) f.fail("rope_theta", "must be positive");
  c.tie_word_embeddings = f.boolOr("tie_word_embeddings", false);
  c.dtype = f.optString("dtype").value_or(f.optString("torch_dtype").value_or(""));
  c.sliding_window = f.optInt("sliding_window");
  c.use_sliding_window = f.boolOr("use_sliding_window", false);
  switch (c.architecture) {
    case Architecture::Qwen2: c.attention_bias = true; break;  // hard-wired in Qwen2Attention
    case Architecture::Qwen2Moe: c.attention_bias = f.boolOr("qkv_bias", true); break;
    case Architecture::Mixtral: c.attention_bias = false; break;
    default: c.attention_bias = f.boolOr("attention_bias", false); break;
  }
  c.qk_norm = c.architecture == Architecture::Qwen3 || c.architecture == Architecture::Qwen3Moe;
  c.mlp_bias = f.boolOr("mlp_bias", false);
  c.rope_interleave = c.architecture == Architecture::DeepseekV3
                          ? f.boolOr("rope_interleave", true)
                          : c.architecture == Architecture::DeepseekV2;
  const std::string act = f.optString("hidden_act").value_or("silu");
  if (act != "silu") {
    f.fail(
        "hidden_act",
        "is \"" + excerptForMessage(act) + "\"; Tandem's experts and MLPs implement \"silu\" only",
        "use a model with SiLU-gated MLPs");
  }
  if (mla) {
    c.q_lora_rank = f.has("q_lora_rank")
                        ? std::optional(f.positive("q_lora_rank", f.optInt("q_lora_rank")))
                        : std::nullopt;
    // asInt bounds each, so their sum below cannot overflow.
    c.kv_lora_rank = asInt(f, "kv_lora_rank", f.requiredPositive("kv_lora_rank"));
    c.qk_rope_head_dim = asInt(f, "qk_rope_head_dim", f.requiredPositive("qk_rope_head_dim"));
    c.qk_nope_head_dim = asInt(f, "qk_nope_head_dim", f.requiredPositive("qk_nope_head_dim"));
    c.v_head_dim = asInt(f, "v_head_dim", f.requiredPositive("v_head_dim"));
    c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  } else if (f.has("head_dim")) {
    c.head_dim = f.positive("head_dim", f.optInt("head_dim"));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      f.fail("hidden_size",
             "(" + std::to_string(c.hidden_size) + ") is not divisible by num_attention_heads (" +
                 std::to_string(c.num_attention_heads) + ") and head_dim is absent",
             "add \"head_dim\" to the config or fix the sizes");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    f.fail("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) +
                                      ") does not divide num_attention_heads (" +
                                      std::to_string(c.num_attention_heads) + ")");
  }
}

// Routed-expert count under whichever key the architecture (and writer) uses.
std::optional<int64_t> readExpertCount(const Fields& f, Architecture arch, const char** key) {
  std::array<const char*, 3> keys{};
  switch (arch) {
    case Architecture::DeepseekV2:
    case Architecture::DeepseekV3:
      keys = {"n_routed_experts", "num_local_experts", "num_experts"};
      break;
    case Architecture::Mixtral:
      keys = {"num_local_experts", "num_experts", "n_routed_experts"};
      break;
    default: keys = {"num_experts", "num_local_experts", "n_routed_experts"}; break;
  }
  for (const char* candidate : keys) {
    if (f.has(candidate)) {
      *key = candidate;
      return f.optInt(candidate);
    }
  }
  *key = keys[0];
  return std::nullopt;
}

// DeepSeek's MoE block: shared experts, dense prefix, and (group-limited) routing. Defaults are
// those of transformers' DeepseekV2Config / DeepseekV3Config.
void readDeepseekMoe(const Fields& f, ModelConfig& c, const char* experts_key) {
  const bool v3 = c.architecture == Architecture::DeepseekV3;
  c.n_shared_experts = asInt(f, "n_shared_experts", f.nonNegativeOr("n_shared_experts", 0));
  c.norm_topk_prob = f.boolOr("norm_topk_prob", v3);
  c.first_k_dense_replace =
      asInt(f, "first_k_dense_replace", f.nonNegativeOr("first_k_dense_replace", v3 ? 3 : 0));
  c.moe_layer_freq = asInt(f, "moe_layer_freq", f.positiveOr("moe_layer_freq", 1));
  c.routed_scaling_factor = f.numberOr("routed_scaling_factor", v3 ? 2.5 : 1.0);
  std::string scoring = f.optString("scoring_func").value_or(v3 ? "sigmoid" : "softmax");
  if (scoring == "softmax")
    c.scoring_func = ScoringFunc::Softmax;
  else if (scoring == "sigmoid")
    c.scoring_func = ScoringFunc::Sigmoid;
  else
    f.fail("scoring_func",
           "is \"" + excerptForMessage(scoring) + "\"; expected softmax or sigmoid");
  std::string method = f.optString("topk_method").value_or(v3 ? "noaux_tc" : "greedy");
  if (method == "greedy")
    c.topk_method = TopkMethod::Greedy;
  else if (method == "group_limited_greedy")
    c.topk_method = TopkMethod::GroupLimitedGreedy;
  else if (method == "noaux_tc")
    c.topk_method = TopkMethod::NoauxTc;
  else
    f.fail("topk_method", "is \"" + excerptForMessage(method) +
                              "\"; expected greedy, group_limited_greedy or noaux_tc");
  // transformers' DeepseekV3Config defaults n_group=8, topk_group=4; V2 has no default.
  // 0 stands for "absent" here; present values must be positive.
  int64_t n_group = f.has("n_group") ? f.positive("n_group", f.optInt("n_group")) : (v3 ? 8 : 0);
  int64_t topk_group =
      f.has("topk_group") ? f.positive("topk_group", f.optInt("topk_group")) : (v3 ? 4 : 0);
  if (n_group > 0) c.n_group = asInt(f, "n_group", n_group);
  if (topk_group > 0) c.topk_group = asInt(f, "topk_group", topk_group);
  if (c.n_group && c.num_experts % *c.n_group != 0) {
    f.fail(experts_key, "(" + std::to_string(c.num_experts) + ") is not divisible by n_group (" +
                            std::to_string(*c.n_group) + ")");
  }
  if (c.n_group && c.topk_group && *c.topk_group > *c.n_group) {
    f.fail("topk_group", "(" + std::to_string(*c.topk_group) + ") is larger than n_group (" +
                             std::to_string(*c.n_group) + ")");
  }
  if (c.topk_method != TopkMethod::Greedy && (!c.n_group || !c.topk_group)) {
    f.fail("topk_method", "is " + method + ", which needs n_group and topk_group");
  }
}

void readMoe(const Fields& f, ModelConfig& c) {
  const Architecture arch = c.architecture;
  const bool deepseek = arch == Architecture::DeepseekV2 || arch == Architecture::DeepseekV3;
  const char* experts_key = nullptr;
  std::optional<int64_t> num_experts = readExpertCount(f, arch, &experts_key);
  if (!num_experts) f.fail(experts_key, "is missing (required for " + c.model_type + ")");
  c.num_experts = asInt(f, experts_key, f.positive(experts_key, num_experts));
  c.num_experts_per_tok =
      asInt(f, "num_experts_per_tok", f.requiredPositive("num_experts_per_tok"));
  if (c.num_experts_per_tok > c.num_experts) {
    f.fail("num_experts_per_tok", "(" + std::to_string(c.num_experts_per_tok) +
                                      ") is larger than the number of experts (" +
                                      std::to_string(c.num_experts) + ")");
  }
  c.moe_intermediate_size = arch == Architecture::Mixtral
                                ? c.intermediate_size
                                : f.requiredPositive("moe_intermediate_size");
  c.router_aux_loss_coef = f.numberOr("router_aux_loss_coef", f.numberOr("aux_loss_alpha", 0.001));
  if (arch == Architecture::Mixtral) {
    c.norm_topk_prob = true;  // Mixtral renormalises the top-k softmax weights by construction
    return;
  }
  if (!deepseek) {
    c.shared_expert_intermediate_size =
        arch == Architecture::Qwen2Moe ? f.nonNegativeOr("shared_expert_intermediate_size", 0) : 0;
    c.norm_topk_prob = f.boolOr("norm_topk_prob", false);
    c.decoder_sparse_step = asInt(f, "decoder_sparse_step", f.positiveOr("decoder_sparse_step", 1));
    for (int64_t layer : f.intList("mlp_only_layers")) {
      c.mlp_only_layers.push_back(asInt(f, "mlp_only_layers", layer));
    }
    return;
  }
  readDeepseekMoe(f, c, experts_key);
}

}  // namespace

std::string_view architectureName(Architecture arch) {
  return kModelTypes[static_cast<size_t>(arch)];
}
std::span<const std::string_view> supportedModelTypes() { return kModelTypes; }
std::string_view ropeTypeName(RopeType type) { return kRopeTypes[static_cast<size_t>(type)]; }

std::string_view scoringFuncName(ScoringFunc func) {
  return func == ScoringFunc::Sigmoid ? "sigmoid" : "softmax";
}

std::string_view topkMethodName(TopkMethod method) {
  switch (method) {
    case TopkMethod::Greedy: return "greedy";
    case TopkMethod::GroupLimitedGreedy: return "group_limited_greedy";
    case TopkMethod::NoauxTc: return "noaux_tc";
  }
  return "?";
}

bool ModelConfig::isMla() const {
  return architecture == Architecture::DeepseekV2 || architecture == Architecture::DeepseekV3;
}

bool ModelConfig::isMoeLayer(int layer) const {
  if (layer < 0 || layer >= num_hidden_layers || num_experts <= 0) return false;
  switch (architecture) {
    case Architecture::Qwen2Moe:
    case Architecture::Qwen3Moe:  // Qwen3MoeDecoderLayer.__init__
      return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
                 mlp_only_layers.end() &&
             (layer + 1) % decoder_sparse_step == 0;
    case Architecture::DeepseekV2:
    case Architecture::DeepseekV3:  // DeepseekV3DecoderLayer (remote code adds moe_layer_freq)
      return layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
    case Architecture::Mixtral: return true;
    default: return false;
  }
}

int ModelConfig::numMoeLayers() const {
  int count = 0;
  for (int layer = 0; layer < num_hidden_layers; ++layer) count += isMoeLayer(layer) ? 1 : 0;
  return count;
}

ModelConfig parseModelConfig(std::string_view json_text, const std::string& label) {
  const Json root = parseBoundedJson(json_text, kModelConfigJsonLimits, label);
  if (!root.is_object()) {
    throw Error(label + ": expected a JSON object at the top level", "this is not a config.json");
  }
  Fields fields(root, label);
  ModelConfig config;
  config.architecture = parseArchitecture(fields);
  config.model_type = std::string(architectureName(config.architecture));
  readBody(fields, config);
  const Architecture arch = config.architecture;
  if (arch != Architecture::Llama && arch != Architecture::Qwen2 && arch != Architecture::Qwen3) {
    readMoe(fields, config);
  }
  readQuantization(fields, config);
  return config;
}

}  // namespace tandem::io
