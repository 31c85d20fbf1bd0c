#pragma once
// ModelConfig: everything the math of the supported architectures needs, read from a Hugging Face
// config.json. Two spellings are accepted, because both are in the wild:
//   - the classic one published with the models (transformers 4.x): top-level "rope_theta",
//     "rope_scaling" {"type"|"rope_type", "factor", ...}, "torch_dtype";
//   - the one transformers 5 writes: "rope_parameters" {"rope_type", "rope_theta", "factor", ...},
//     "dtype", and for qwen3_moe "num_local_experts" instead of "num_experts".
// Missing optional fields take the defaults of the transformers 5.17 config classes. Anything
// inconsistent is a tandem::Error naming the file and the field.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::io {

enum class Architecture : uint8_t {
  Qwen3Moe,
  Qwen2Moe,
  DeepseekV2,
  DeepseekV3,
  Mixtral,
  Llama,
  Qwen2,
  Qwen3
};

std::string_view architectureName(Architecture arch);     // the model_type spelling
std::span<const std::string_view> supportedModelTypes();  // in Architecture order

// transformers' ROPE_INIT_FUNCTIONS keys ("default" when there is no scaling).
enum class RopeType : uint8_t { Default, Linear, Dynamic, Yarn, Longrope, Llama3 };
std::string_view ropeTypeName(RopeType type);

struct RopeScaling {
  RopeType type = RopeType::Default;
  double factor = 1.0;
  std::optional<int64_t> original_max_position_embeddings;
  std::optional<double> attention_factor;  // yarn / longrope
  std::optional<double> beta_fast;         // yarn
  std::optional<double> beta_slow;         // yarn
  std::optional<double> mscale;            // yarn (DeepSeek)
  std::optional<double> mscale_all_dim;    // yarn (DeepSeek)
  std::optional<double> low_freq_factor;   // llama3
  std::optional<double> high_freq_factor;  // llama3
};

enum class ScoringFunc : uint8_t { Softmax, Sigmoid };
enum class TopkMethod : uint8_t { Greedy, GroupLimitedGreedy, NoauxTc };
std::string_view scoringFuncName(ScoringFunc func);
std::string_view topkMethodName(TopkMethod method);

// "quantization_config" of pre-quantized checkpoints, e.g. DeepSeek-V3's
// {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}.
struct QuantizationConfig {
  std::string quant_method;
  std::string fmt;                         // empty when absent
  std::string activation_scheme;           // empty when absent
  std::vector<int64_t> weight_block_size;  // empty when absent
  // compressed-tensors (Kimi-K2-Thinking's {"quant_method": "compressed-tensors", "format":
  // "pack-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 32,
  // "symmetric": true, "type": "int"}}}}): the first config group's weights; 0 when absent.
  std::string format;
  int64_t weight_bits = 0;
  int64_t weight_group_size = 0;
  bool weight_symmetric = true;
};

struct ModelConfig {
  std::filesystem::path source;  // the config.json this came from ("" when parsed from text)
  Architecture architecture = Architecture::Llama;
  std::string model_type;
  std::string dtype;  // "bfloat16", ... from "dtype" or "torch_dtype"; empty when absent

  // Transformer body.
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP width (Mixtral: every expert's width)
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // defaults to num_attention_heads
  // Per-head q/k width. GQA: "head_dim" or hidden_size / heads. MLA: qk_nope + qk_rope (the
  // width the softmax scale uses); transformers 5 writes head_dim = qk_rope_head_dim there, which
  // we do not use.
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (qwen2: always; qwen2_moe: "qkv_bias")
  bool qk_norm = false;         // per-head RMSNorm on q and k (qwen3, qwen3_moe)
  bool mlp_bias = false;        // biases on gate/up/down (deepseek "mlp_bias")
  // DeepSeek-V3 checkpoints pair rope dims as neighbours (true, the default) or halves.
  // DeepSeek-V2 always pairs neighbours; the GQA architectures always use halves.
  bool rope_interleave = true;
  std::optional<int64_t> sliding_window;  // read and reported, not used by the math yet
  bool use_sliding_window = false;

  // Mixture of experts (0 / defaults for dense models).
  int num_experts = 0;  // qwen: num_experts; deepseek: n_routed_experts; mixtral: num_local_experts
  int num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;            // width of one routed expert
  int64_t shared_expert_intermediate_size = 0;  // qwen2_moe (one shared expert of this width)
  int n_shared_experts = 0;                     // deepseek (width n * moe_intermediate_size)
  bool norm_topk_prob = false;
  int decoder_sparse_step = 1;         // qwen
  std::vector<int> mlp_only_layers;    // qwen
  int first_k_dense_replace = 0;       // deepseek
  int moe_layer_freq = 1;              // deepseek
  double routed_scaling_factor = 1.0;  // deepseek
  ScoringFunc scoring_func = ScoringFunc::Softmax;
  TopkMethod topk_method = TopkMethod::Greedy;
  std::optional<int> n_group;  // deepseek group-limited routing
  std::optional<int> topk_group;
  double router_aux_loss_coef = 0.0;  // read only: Tandem does not train routers yet

  // Multi-head latent attention (deepseek_v2 / v3).
  std::optional<int64_t> q_lora_rank;  // nullopt: q is one dense projection (DeepSeek-V2-Lite)
  int64_t kv_lora_rank = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t v_head_dim = 0;

  std::optional<QuantizationConfig> quantization;
  // Routed experts that the checkpoint stores in a format the expert engine computes on as stored
  // (engine/placement/expert_format.h: GGUF blocks "q4_k", ..., compressed-tensors "int4"): its
  // name (for a GGUF file mixing types, the one holding most bytes) and, for GGUF files, the bytes
  // of each layer's routed experts in the file (index: layer; 0 for a dense layer). Empty for
  // plain and fp8 checkpoints.
  std::string stored_expert_format;
  std::vector<uint64_t> stored_expert_layer_bytes;

  bool isMoe() const { return num_experts > 0; }
  bool isMla() const;
  // Whether decoder layer `layer` has a routed-expert block, by the rule of the architecture's
  // transformers modeling file. False for layers outside [0, num_hidden_layers).
  bool isMoeLayer(int layer) const;
  int numMoeLayers() const;
};

// Parses config.json text; `label` (usually the path) names the file in error messages.
ModelConfig parseModelConfig(std::string_view json_text, const std::string& label);

// Reads `path`: a config.json file, or a model directory holding one, or a GGUF model (a .gguf
// file, or a directory with one and no config.json; its metadata translated by GgufModel).
ModelConfig readModelConfig(const std::filesystem::path& path);

}  // namespace tandem::io
