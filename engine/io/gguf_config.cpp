// config.json from a GGUF file's `ARCH.*` metadata: the inverse of what llama.cpp's
// convert_hf_to_gguf.py writes for each architecture (docs/gguf.md has the table).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>

#include "engine/core/error.h"
#include "engine/io/bounded_json.h"
#include "engine/io/gguf_model_detail.h"

namespace tandem::io::gguf_detail {
namespace {

using Json = nlohmann::json;

// `ARCH.name` keys of one file, with errors that name the file and the key.
class ArchKeys {
 public:
  ArchKeys(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  std::string key(std::string_view name) const { return arch_ + "." + std::string(name); }
  bool has(std::string_view name) const { return file_.find(key(name)) != nullptr; }
  int64_t integer(std::string_view name) const { return file_.getInt(key(name)); }
  std::optional<int64_t> optInteger(std::string_view name) const { return file_.optInt(key(name)); }
  double real(std::string_view name) const { return file_.getFloat(key(name)); }
  std::optional<double> optReal(std::string_view name) const { return file_.optFloat(key(name)); }
  std::optional<bool> optBool(std::string_view name) const { return file_.optBool(key(name)); }
  std::optional<std::string> optString(std::string_view name) const {
    return file_.optString(key(name));
  }

  // A count that some converters write per layer (an array): every layer must agree, since the
  // HF architectures read here have one value.
  int64_t uniform(std::string_view name) const {
    const GgufValue* value = file_.find(key(name));
    if (value == nullptr || value->type != GgufValueType::Array) return integer(name);
    const std::vector<int64_t>& per_layer = file_.getInts(key(name));
    if (per_layer.empty() || std::adjacent_find(per_layer.begin(), per_layer.end(),
                                                std::not_equal_to<>()) != per_layer.end()) {
      throw Error(file_.path().string() + ": " + key(name) + " differs between layers",
                  "models whose layers differ in this are not supported");
    }
    return per_layer.front();
  }

 private:
  const GgufFile& file_;
  std::string arch_;
};

// llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE values.
constexpr int64_t kGatingSoftmax = 1;
constexpr int64_t kGatingSigmoid = 2;

void readRope(const ArchKeys& k, const std::string& label, Json& config) {
  Json rope = {{"rope_type", "default"},
               {"rope_theta", k.optReal("rope.freq_base").value_or(10000.0)}};
  const std::string type = k.optString("rope.scaling.type").value_or("none");
  if (type == "linear" || type == "yarn") {
    rope["rope_type"] = type;
    rope["factor"] = k.real("rope.scaling.factor");
    if (auto original = k.optInteger("rope.scaling.original_context_length")) {
      rope["original_max_position_embeddings"] = *original;
    }
    if (type == "yarn") {
      // The converter writes DeepSeek's mscale_all_dim as 0.1 × it (llama.cpp's yarn_log_mul);
      // DeepSeek-V2/V3 ship mscale == mscale_all_dim, which GGUF does not store apart.
      if (auto log_mul = k.optReal("rope.scaling.yarn_log_multiplier")) {
        rope["mscale_all_dim"] = *log_mul / 0.1;
        rope["mscale"] = *log_mul / 0.1;
      }
      if (auto factor = k.optReal("rope.scaling.yarn_attn_factor"))
        rope["attention_factor"] = *factor;
      if (auto fast = k.optReal("rope.scaling.yarn_beta_fast")) rope["beta_fast"] = *fast;
      if (auto slow = k.optReal("rope.scaling.yarn_beta_slow")) rope["beta_slow"] = *slow;
    }
  } else if (type != "none") {
    throw Error(label + ": " + k.key("rope.scaling.type") + " is '" + excerptForMessage(type) +
                    "', which Tandem does not read",
                "Tandem reads GGUF models with rope scaling none, linear or yarn");
  }
  config["rope_parameters"] = rope;
}

void readExperts(const ArchKeys& k, Json& config) {
  config["num_experts"] = k.integer("expert_count");
  config["num_experts_per_tok"] = k.integer("expert_used_count");
  if (k.has("expert_feed_forward_length"))
    config["moe_intermediate_size"] = k.uniform("expert_feed_forward_length");
}

// Llama-3.1's rope scaling, which the converter stores as per-frequency divisors (rope_freqs.weight
// [head_dim / 2]: 1 for high frequencies, `factor` for low ones, 1 / ((1 - s) / factor + s) in the
// band between, s linear in 1 / wavelength) instead of metadata. HF's llama3 parameters are read
// back from them: the result depends only on the band's edges in 1 / wavelength (low_freq_factor /
// original_max_position_embeddings and high_freq_factor / original_max_position_embeddings), so
// any original length reproduces the divisors; 8192 is Llama-3's.
Json llama3Rope(const GgufFile& file, const GgufTensorInfo& rope_freqs, double theta) {
  const std::string label = file.path().string();
  const std::vector<float> divisors = file.dequantize(rope_freqs);
  const size_t n = divisors.size();
  auto fail = [&](const std::string& why) -> Error {
    return Error(
        label + ": rope_freqs.weight " + why + ", not the llama3 rope scaling of Llama-3.1",
        "use the Hugging Face model directory of this model");
  };
  const double factor = *std::max_element(divisors.begin(), divisors.end());
  if (n == 0 || factor <= 1.0) throw fail("has no frequency divided by more than 1");
  // x = 1 / wavelength of each rotary pair, as HF computes it: inv_freq / 2π.
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(2 * n)) /
           (2 * std::numbers::pi);
  }
  auto near = [](double a, double b) {
    return std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b));
  };
  double low_max = 0, high_min = std::numeric_limits<double>::infinity();
  std::vector<std::pair<double, double>> band;  // (x, s)
  for (size_t i = 0; i < n; ++i) {
    const double r = divisors[i];
    if (near(r, 1.0)) {
      high_min = std::min(high_min, x[i]);
    } else if (near(r, factor)) {
      low_max = std::max(low_max, x[i]);
    } else {
      band.emplace_back(x[i], (1.0 / r - 1.0 / factor) / (1.0 - 1.0 / factor));
    }
  }
  // The band's edges L < H in x: s = (x - L) / (H - L).
  double lo = 0, hi = 0;
  if (band.size() >= 2) {  // least squares of s = a x - b
    double sx = 0, ss = 0, sxx = 0, sxs = 0;
    for (const auto& [bx, bs] : band) sx += bx, ss += bs, sxx += bx * bx, sxs += bx * bs;
    const double m = static_cast<double>(band.size());
    const double a = (m * sxs - sx * ss) / (m * sxx - sx * sx);
    const double b = (sx * a - ss) / m;
    lo = b / a;
    hi = (b + 1) / a;
  } else if (band.size() ==
             1) {  // one point fixes one relation; put the low edge midway (log) below it
    const auto [bx, bs] = band.front();
    lo = low_max > 0 ? std::sqrt(low_max * bx) : bx / 2;
    hi = lo + (bx - lo) / bs;
  } else {  // no point in the band: any edges between the two classes
    if (low_max <= 0 || !std::isfinite(high_min))
      throw fail("has no band between the scaled and unscaled frequencies");
    lo = low_max * std::pow(high_min / low_max, 1.0 / 3);
    hi = low_max * std::pow(high_min / low_max, 2.0 / 3);
  }
  if (!(lo > low_max * (1 - 1e-9) && hi > lo && hi < high_min * (1 + 1e-9))) {
    throw fail("does not follow llama3's piecewise rule");
  }
  constexpr int64_t kOriginal = 8192;
  return {{"rope_type", "llama3"},
          {"rope_theta", theta},
          {"factor", factor},
          {"low_freq_factor", lo * kOriginal},
          {"high_freq_factor", hi * kOriginal},
          {"original_max_position_embeddings", kOriginal}};
}

}  // namespace

std::string hfModelType(const GgufFile& file) {
  const std::string arch = file.getString("general.architecture");
  const ArchKeys k(file, arch);
  if (arch == "llama") return k.optInteger("expert_count").value_or(0) > 0 ? "mixtral" : "llama";
  if (arch == "qwen2") return "qwen2";
  if (arch == "qwen3") return "qwen3";
  if (arch == "qwen2moe") return "qwen2_moe";
  if (arch == "qwen3moe") return "qwen3_moe";
  if (arch == "deepseek2") {
    // llama.cpp gates with softmax unless the key says sigmoid (DeepSeek-V3, Kimi-K2 write 2).
    if (k.optInteger("expert_gating_func").value_or(kGatingSoftmax) == kGatingSigmoid)
      return "deepseek_v3";
    const std::string first_moe =
        "blk." + std::to_string(k.optInteger("leading_dense_block_count").value_or(0));
    if (file.findTensor(first_moe + ".exp_probs_b.bias") != nullptr) {
      throw Error(file.path().string() +
                      ": a deepseek2 model with exp_probs_b (DeepSeek-V3's correction bias) but "
                      "softmax gating, which no DeepSeek release has",
                  "re-convert the model with a current llama.cpp, which writes "
                  "deepseek2.expert_gating_func 2 for it");
    }
    return "deepseek_v2";
  }
  throw Error(
      file.path().string() + ": general.architecture is '" + excerptForMessage(arch) +
          "', which Tandem does not read",
      "Tandem reads GGUF models of the architectures llama (and Mixtral), qwen2, qwen3, qwen2moe, "
      "qwen3moe and deepseek2 (DeepSeek-V2/V3, Kimi-K2)");
}

Json hfConfig(const GgufFile& file, const std::string& model_type, int64_t embedding_rows,
              bool tied) {
  const std::string arch = file.getString("general.architecture");
  const std::string label = file.path().string();
  const ArchKeys k(file, arch);
  Json c;
  c["model_type"] = model_type;
  c["hidden_size"] = k.integer("embedding_length");
  c["num_hidden_layers"] = k.integer("block_count");
  c["max_position_embeddings"] = k.optInteger("context_length").value_or(4096);
  c["num_attention_heads"] = k.uniform("attention.head_count");
  c["num_key_value_heads"] = k.has("attention.head_count_kv")
                                 ? k.uniform("attention.head_count_kv")
                                 : c["num_attention_heads"].get<int64_t>();
  c["rms_norm_eps"] = k.real("attention.layer_norm_rms_epsilon");
  c["vocab_size"] = embedding_rows;
  c["tie_word_embeddings"] = tied;
  if (k.has("feed_forward_length")) c["intermediate_size"] = k.uniform("feed_forward_length");
  if (k.has("attention.key_length") && arch != "deepseek2")
    c["head_dim"] = k.integer("attention.key_length");
  // GGUF files keep no compute dtype; bf16 is what the models read here are published in.
  c["dtype"] = "bfloat16";
  readRope(k, label, c);
  if (const GgufTensorInfo* factors = file.findTensor("rope_freqs.weight")) {
    c["rope_parameters"] =
        llama3Rope(file, *factors, c["rope_parameters"].at("rope_theta").get<double>());
  }

  if (model_type == "mixtral") {
    c["num_local_experts"] = k.integer("expert_count");
    c["num_experts_per_tok"] = k.integer("expert_used_count");
  } else if (model_type == "qwen2") {
    c["use_sliding_window"] = false;
  } else if (model_type == "qwen2_moe" || model_type == "qwen3_moe") {
    readExperts(k, c);
    // llama.cpp renormalises the top-k weights for qwen3moe and never for qwen2moe, whatever the
    // HF config said; the GGUF file stores no flag, so its math is the one to follow.
    c["norm_topk_prob"] = model_type == "qwen3_moe";
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = Json::array();
    if (model_type == "qwen2_moe") {
      c["shared_expert_intermediate_size"] = k.integer("expert_shared_feed_forward_length");
      c["qkv_bias"] = true;
    }
  } else if (model_type == "deepseek_v2" || model_type == "deepseek_v3") {
    c["n_routed_experts"] = k.integer("expert_count");
    c["num_experts_per_tok"] = k.integer("expert_used_count");
    c["moe_intermediate_size"] = k.integer("expert_feed_forward_length");
    c["n_shared_experts"] = k.optInteger("expert_shared_count").value_or(0);
    c["first_k_dense_replace"] = k.optInteger("leading_dense_block_count").value_or(0);
    c["moe_layer_freq"] = 1;
    c["routed_scaling_factor"] = k.optReal("expert_weights_scale").value_or(1.0);
    c["norm_topk_prob"] = k.optBool("expert_weights_norm").value_or(false);
    const auto q_lora_rank = k.optInteger("attention.q_lora_rank").value_or(0);
    c["q_lora_rank"] = q_lora_rank > 0 ? Json(q_lora_rank) : Json(nullptr);
    c["kv_lora_rank"] = k.integer("attention.kv_lora_rank");
    const int64_t rope_dim = k.integer("rope.dimension_count");
    // Newer converters store MLA's absorbed widths in key_length/value_length and the per-head
    // ones in key_length_mla/value_length_mla; older ones only the per-head ones.
    const int64_t key_length =
        k.optInteger("attention.key_length_mla").value_or(k.integer("attention.key_length"));
    const int64_t value_length =
        k.optInteger("attention.value_length_mla").value_or(k.integer("attention.value_length"));
    c["qk_rope_head_dim"] = rope_dim;
    c["qk_nope_head_dim"] = key_length - rope_dim;
    c["v_head_dim"] = value_length;
    c["rope_interleave"] = true;
    // The converter writes MLA as MQA (head_count_kv 1); HF's config has one kv head per head.
    c["num_key_value_heads"] = c["num_attention_heads"];
    const bool sigmoid =
        k.optInteger("expert_gating_func").value_or(kGatingSoftmax) == kGatingSigmoid;
    c["scoring_func"] = sigmoid ? "sigmoid" : "softmax";
    const auto groups = k.optInteger("expert_group_count").value_or(1);
    if (groups > 1) {
      c["n_group"] = groups;
      c["topk_group"] = k.integer("expert_group_used_count");
    }
    c["topk_method"] =
        model_type == "deepseek_v3" ? "noaux_tc" : (groups > 1 ? "group_limited_greedy" : "greedy");
  }
  return c;
}

}  // namespace tandem::io::gguf_detail
