#include "engine/io/model_summary.h"

#include <algorithm>
#include <charconv>

#include "engine/io/gguf_model.h"
#include "engine/io/safetensors.h"

namespace tandem::io {
namespace {

constexpr std::array<std::string_view, kParamCategoryCount> kCategoryKeys = {
    "embeddings", "attention", "routed_experts", "shared_experts", "dense_mlp",
    "router",     "norms",     "lm_head",        "other"};

bool startsWith(std::string_view s, std::string_view prefix) { return s.starts_with(prefix); }
bool endsWith(std::string_view s, std::string_view suffix) { return s.ends_with(suffix); }

TensorClass param(ParamCategory category) { return {category, TensorRole::Parameter}; }
constexpr TensorClass kUnrecognised{ParamCategory::Other, TensorRole::Unrecognised};

bool isQuantScale(std::string_view name) {
  return endsWith(name, ".weight_scale_inv") || endsWith(name, ".weight_scale") ||
         endsWith(name, ".input_scale");
}

// `rest` is the part after "model.layers.N.".
TensorClass classifyLayerTensor(std::string_view rest) {
  if (startsWith(rest, "input_layernorm.") || startsWith(rest, "post_attention_layernorm.")) {
    return param(ParamCategory::Norms);
  }
  if (startsWith(rest, "self_attn.")) {
    // Old checkpoints saved RoPE's inverse frequencies; a buffer, not a weight.
    if (endsWith(rest, "rotary_emb.inv_freq")) return {ParamCategory::Other, TensorRole::Buffer};
    // q_norm / k_norm (qwen3) and q_a_layernorm / kv_a_layernorm (MLA) are RMSNorm weights.
    std::string_view module = rest.substr(std::string_view("self_attn.").size());
    if (module.find("norm.") != std::string_view::npos) return param(ParamCategory::Norms);
    return param(ParamCategory::Attention);
  }
  std::string_view mlp;
  if (startsWith(rest, "mlp.")) {
    mlp = rest.substr(4);
  } else if (startsWith(rest, "block_sparse_moe.")) {  // mixtral's checkpoint spelling
    mlp = rest.substr(17);
  } else {
    return kUnrecognised;
  }
  // Per-expert (experts.E.*) and fused (experts.gate_up_proj, experts.down_proj) forms alike.
  if (startsWith(mlp, "experts.")) return param(ParamCategory::RoutedExperts);
  // qwen2_moe: shared_expert.* and its sigmoid shared_expert_gate (which only scales the shared
  // expert, so it is counted with it); deepseek: shared_experts.*.
  if (startsWith(mlp, "shared_expert")) return param(ParamCategory::SharedExperts);
  // Router: "gate.weight" (qwen, deepseek, mixtral) and deepseek-v3's
  // "gate.e_score_correction_bias" (a persistent buffer in transformers, but part of the routing
  // math). Not gate_proj.
  if (startsWith(mlp, "gate.") || startsWith(mlp, "router.")) return param(ParamCategory::Router);
  if (startsWith(mlp, "gate_proj.") || startsWith(mlp, "up_proj.") ||
      startsWith(mlp, "down_proj.")) {
    return param(ParamCategory::DenseMlp);
  }
  return kUnrecognised;
}

int64_t numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

}  // namespace

std::string_view paramCategoryKey(ParamCategory category) {
  return kCategoryKeys[static_cast<size_t>(category)];
}

int64_t ParameterCounts::total() const {
  int64_t sum = 0;
  for (int64_t n : by_category) sum += n;
  return sum;
}

TensorClass classifyTensor(std::string_view name, int num_hidden_layers) {
  if (isQuantScale(name)) return {ParamCategory::Other, TensorRole::QuantScale};
  if (name == "lm_head.weight") return param(ParamCategory::LmHead);
  if (!startsWith(name, "model.")) return kUnrecognised;
  std::string_view body = name.substr(6);
  if (startsWith(body, "embed_tokens.")) return param(ParamCategory::Embeddings);
  if (startsWith(body, "norm.")) return param(ParamCategory::Norms);
  if (!startsWith(body, "layers.")) return kUnrecognised;
  body.remove_prefix(7);
  size_t dot = body.find('.');
  int layer = -1;
  if (dot == std::string_view::npos) return kUnrecognised;
  auto [end, ec] = std::from_chars(body.data(), body.data() + dot, layer);
  if (ec != std::errc() || end != body.data() + dot || layer < 0) return kUnrecognised;
  if (layer >= num_hidden_layers) return {ParamCategory::Other, TensorRole::ExtraLayer};
  return classifyLayerTensor(body.substr(dot + 1));
}

ModelSummary summarizeTensors(io::ModelConfig config, std::span<const TensorRecord> tensors) {
  ModelSummary s;
  s.num_layers = config.num_hidden_layers;
  s.num_moe_layers = config.numMoeLayers();
  s.num_tensors = tensors.size();
  std::vector<std::string> unrecognised;
  for (const TensorRecord& t : tensors) {
    const int64_t n = numel(t.shape);
    TensorClass cls = classifyTensor(t.name, config.num_hidden_layers);
    s.parameters[cls.category] += n;
    s.dtype_parameters[std::string(io::dtypeName(t.dtype))] += n;
    switch (cls.role) {
      case TensorRole::QuantScale: ++s.num_scale_tensors; break;
      case TensorRole::ExtraLayer: ++s.num_extra_layer_tensors; break;
      case TensorRole::Unrecognised: unrecognised.push_back(t.name); break;
      case TensorRole::Parameter:
      case TensorRole::Buffer: break;
    }
  }
  std::sort(unrecognised.begin(), unrecognised.end());
  s.num_unrecognised = unrecognised.size();
  if (unrecognised.size() > kMaxListedUnrecognised) unrecognised.resize(kMaxListedUnrecognised);
  s.unrecognised_tensors = std::move(unrecognised);

  const int64_t routed = s.parameters[ParamCategory::RoutedExperts];
  s.active_parameters = s.parameters.total() - routed - s.parameters[ParamCategory::Other];
  if (config.num_experts > 0) {
    // routed <= ~1e12 and top-k <= a few dozen: the product fits in int64.
    s.active_parameters += routed * config.num_experts_per_tok / config.num_experts;
  }
  s.config = std::move(config);
  return s;
}

namespace {

// A GGUF model's tensors under their HF names; dtypes are ggml's ("Q4_K", "BF16"), so they are
// counted here rather than by summarizeTensors' io::DType names.
ModelSummary summarizeGguf(const std::filesystem::path& path) {
  const std::unique_ptr<io::GgufModel> gguf = io::GgufModel::open(path);
  io::ModelConfig config = io::parseModelConfig(gguf->configJson(), gguf->path().string());
  config.source = gguf->path();
  std::vector<TensorRecord> records;
  std::map<std::string, int64_t> by_type;
  for (const auto& [name, source] : gguf->tensors()) {
    records.push_back({name, io::DType::F32, source.shape});
    std::string type(io::ggmlTypeName(source.tensor->type));
    std::transform(type.begin(), type.end(), type.begin(),
                   [](unsigned char c) { return std::toupper(c); });
    by_type[type] += numel(source.shape);
  }
  for (const std::string& name : gguf->unmapped()) {
    const io::GgufTensorInfo* t = gguf->file().findTensor(name);
    records.push_back({name, io::DType::F32, t->torchShape()});
  }
  ModelSummary s = summarizeTensors(std::move(config), records);
  s.dtype_parameters = std::move(by_type);
  s.bytes_on_disk = gguf->file().fileBytes();
  s.num_files = 1;
  return s;
}

}  // namespace

ModelSummary summarizeModel(const std::filesystem::path& dir) {
  if (io::isGgufPath(dir)) return summarizeGguf(dir);
  io::ModelConfig config = io::readModelConfig(dir);
  // A config.json path is accepted too; the weights sit beside it.
  std::error_code ec;
  std::filesystem::path weights = std::filesystem::is_directory(dir, ec) ? dir : dir.parent_path();
  io::SafetensorsModel model = io::SafetensorsModel::open(weights);
  std::vector<TensorRecord> records;
  for (const std::string& name : model.names()) {
    const io::TensorInfo* info = model.find(name);
    records.push_back({name, info->dtype, info->shape});
  }
  ModelSummary s = summarizeTensors(std::move(config), records);
  s.bytes_on_disk = model.totalFileBytes();
  s.num_files = model.files().size();
  return s;
}

}  // namespace tandem::io
