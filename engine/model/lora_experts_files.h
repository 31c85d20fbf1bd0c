#pragma once
// LoRA experts (lora_experts.h) saved beside a PEFT adapter (docs/peft_formats.md):
//   lora_experts.safetensors    "base_model.model.model.layers.N.mlp.lora_experts.K.
//                                {gate_proj,up_proj,down_proj}.weight", fp32, [le_dim, hidden] for
//                                gate and up, [hidden, le_dim] for down; every MoE layer, K paths
//   lora_experts_config.json    {"lora_experts": K, "le_dim": D, "hidden_size": H, ...}
// PEFT reads adapter_config.json and adapter_model.safetensors only, so it loads the adapter
// without LE; Tandem's exporters warn about that (adapter_files.h).

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/model/lora_experts.h"

namespace tandem::model {

class CausalLm;

inline constexpr const char* kLoraExpertsWeightsFile = "lora_experts.safetensors";
inline constexpr const char* kLoraExpertsConfigFile = "lora_experts_config.json";

struct SavedLoraExperts {
  int64_t count = 0;  // paths per MoE layer; 0: the adapter has no LE
  int64_t le_dim = 0;
  std::map<std::string, std::vector<LoraExpertPath>> layers;  // "model.layers.N.mlp" -> paths
  bool defined() const { return count > 0; }
};

// The LE of the adapter in `dir`, validated against `config` (every MoE layer, shapes, names);
// empty when the dir has neither file. Errors say which file is wrong and what to do.
SavedLoraExperts readLoraExperts(const std::filesystem::path& dir, const io::ModelConfig& config);

// Writes the model's LE into `dir` (both files, each atomically), or, for a model without LE,
// removes LE files an earlier save left there, so the dir never pairs a new adapter with old LE.
void writeLoraExperts(CausalLm& model, const std::filesystem::path& dir);

// Copies saved LE into a model built with the same lora_experts and le_dim (an Error otherwise).
void applyLoraExperts(const SavedLoraExperts& saved, CausalLm& model,
                      const std::filesystem::path& dir);

}  // namespace tandem::model
