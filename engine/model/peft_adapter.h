#pragma once
// PEFT LoRA adapters (adapter_config.json + adapter_model.safetensors) on a CausalLm.
//
// Names are PEFT's: "base_model.model." + HF module name + ".lora_A.weight" / ".lora_B.weight".
// Routed experts come in two forms (docs/peft_formats.md):
//   per expert  ...mlp.experts.E.{gate,up,down}_proj.lora_{A,B}.weight  (Tandem's own form)
//   fused       PEFT >= 0.18 target_parameters on mlp.experts.gate_up_proj / down_proj:
//               ...mlp.experts[.base_layer].lora_{A,B}.weight with every expert's rank stacked.
// A block-structured fused adapter (A_e = [A_gate; A_up], B_e = diag(B_gate, B_up)) maps onto
// per-expert LoRA of rank r exactly; any other fused adapter is applied exactly with rank 2r per
// projection (gate and up sharing their A).

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/model/adapter_files.h"
#include "engine/model/causal_lm.h"
#include "engine/model/lora_experts_files.h"

namespace tandem::model {

struct PeftAdapter {
  std::filesystem::path dir;
  gpu::LoraSettings settings;           // r, lora_alpha, use_rslora, lora_dropout
  std::map<std::string, at::Tensor> a;  // HF module name -> A [r, in] fp32
  std::map<std::string, at::Tensor> b;  // HF module name -> B [out, r] fp32
  // Routed experts, per expert and projection: "model.layers.N.mlp.experts.E.gate_proj".
  // Their rank may exceed settings.rank (general fused adapters); the scale is folded into B.
  int expert_rank = 0;
  // LoRA experts saved beside the adapter (lora_experts_files.h); empty when it has none.
  SavedLoraExperts lora_experts;
};

// Reads and validates an adapter dir against the model's config (names, shapes).
PeftAdapter readPeftAdapter(const std::filesystem::path& dir, const io::ModelConfig& config);

// The LoRA plan that makes CausalLm::load create exactly the adapter's modules.
LoraPlan loraPlanFor(const PeftAdapter& adapter);

// Copies the adapter's weights into a model loaded with loraPlanFor(adapter).
void applyPeftAdapter(const PeftAdapter& adapter, CausalLm& model);

// Writes the model's LoRA weights as a PEFT adapter dir (adapter_config.json +
// adapter_model.safetensors, each written atomically), and its LoRA experts beside them. The fused
// form stores every expert's gate/up pair block-structured (rank 2r, alpha chosen so the scale is
// unchanged).
void writePeftAdapter(CausalLm& model, const gpu::LoraSettings& settings,
                      const std::filesystem::path& dir, ExpertAdapterForm form,
                      const std::string& base_model_name);

// Every LoRA tensor of the model under PEFT's names (routed experts per expert): the weights,
// or their gradients. fp32 CPU tensors.
std::map<std::string, at::Tensor> loraTensors(CausalLm& model, bool gradients);

}  // namespace tandem::model
