#pragma once
// ModelSummary: what is in a Hugging Face model directory, counted from the safetensors headers
// (no tensor data is read): parameters by role, by dtype, bytes on disk, active parameters/token.
//
// Tensors are classified by their HF names. Both spellings of routed experts are recognised:
//   per expert  model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight           (qwen, deepseek)
//               model.layers.N.block_sparse_moe.experts.E.w{1,2,3}.weight          (mixtral)
//   fused       model.layers.N.mlp.experts.{gate_up_proj,down_proj}[.weight]       (transformers 5
//               in memory; its save_pretrained converts back to the per-expert names)
// Quantization scales (FP8 "weight_scale_inv", "weight_scale", "input_scale") are not parameters of
// the math: they count under Other, and `num_scale_tensors` says how many there were. Tensors of
// layers past num_hidden_layers (DeepSeek-V3's multi-token-prediction layer 61) also count under
// Other. Names nothing recognises count under Other and are listed (the first 10).

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/io/dtype.h"
#include "engine/io/model_config.h"

namespace tandem::io {

enum class ParamCategory : uint8_t {
  Embeddings,
  Attention,
  RoutedExperts,
  SharedExperts,
  DenseMlp,
  Router,
  Norms,
  LmHead,
  Other
};
inline constexpr size_t kParamCategoryCount = 9;
// snake_case key as used in `tandem inspect --json` ("routed_experts", ...).
std::string_view paramCategoryKey(ParamCategory category);

// Why a tensor landed where it did; only Other has more than one reason.
enum class TensorRole : uint8_t { Parameter, QuantScale, Buffer, ExtraLayer, Unrecognised };

struct TensorClass {
  ParamCategory category = ParamCategory::Other;
  TensorRole role = TensorRole::Unrecognised;
};

// Classifies one HF tensor name. `num_hidden_layers` separates decoder layers from extra ones.
TensorClass classifyTensor(std::string_view name, int num_hidden_layers);

struct ParameterCounts {
  std::array<int64_t, kParamCategoryCount> by_category{};

  int64_t& operator[](ParamCategory c) { return by_category[static_cast<size_t>(c)]; }
  int64_t operator[](ParamCategory c) const { return by_category[static_cast<size_t>(c)]; }
  int64_t total() const;  // every tensor element in the checkpoint, Other included
};

// The header facts of one tensor; what summarizeTensors needs (lets tests skip the files).
struct TensorRecord {
  std::string name;
  io::DType dtype = io::DType::BF16;
  std::vector<int64_t> shape;
};

struct ModelSummary {
  io::ModelConfig config;
  int num_layers = 0;
  int num_moe_layers = 0;
  ParameterCounts parameters;
  // Approximate parameters touched per token: everything but routed experts and Other, plus
  // num_experts_per_tok / num_experts of the routed experts (equal-load assumption).
  int64_t active_parameters = 0;
  std::map<std::string, int64_t> dtype_parameters;  // "BF16" -> elements, all tensors
  uint64_t bytes_on_disk = 0;                       // sum of the .safetensors file sizes
  size_t num_tensors = 0;
  size_t num_files = 0;
  size_t num_scale_tensors = 0;
  size_t num_extra_layer_tensors = 0;
  size_t num_unrecognised = 0;
  std::vector<std::string> unrecognised_tensors;  // the first 10 names, sorted
};

inline constexpr size_t kMaxListedUnrecognised = 10;

// Pure counting over tensor headers; bytes_on_disk and num_files are left 0.
ModelSummary summarizeTensors(io::ModelConfig config, std::span<const TensorRecord> tensors);

// Reads `dir`/config.json and the safetensors headers (single file or sharded index), or a GGUF
// model (its tensors under their HF names, dtypes as ggml names them: "Q4_K", "BF16").
ModelSummary summarizeModel(const std::filesystem::path& dir);

}  // namespace tandem::io
