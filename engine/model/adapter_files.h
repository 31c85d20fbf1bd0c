#pragma once
// LoRA adapter files for code outside engine/model: PEFT adapter dirs (adapter_config.json +
// adapter_model.safetensors, peft_adapter.h has the formats) and llama.cpp LoRA GGUFs
// (gguf_lora.h). No libtorch: each call reads or writes the files itself.

#include <filesystem>
#include <string>

#include "engine/io/model_config.h"
#include "engine/model/lora_plan.h"

namespace tandem::model {

class Model;

// How routed experts' LoRA is written (docs/peft_formats.md).
enum class ExpertAdapterForm {
  PerExpert,     // ...mlp.experts.E.{gate,up,down}_proj.lora_{A,B}.weight (Tandem's own)
  Fused,         // PEFT 0.18-0.20 target_parameters layout (the pinned reference PEFT)
  FusedPeft021,  // PEFT >= 0.21, which reads 3-D expert LoRA in the other orientation
};

// The LoRA plan that makes Model::load create exactly the modules of the adapter in `dir` (a PEFT
// adapter dir, or a llama.cpp LoRA GGUF file for a GGUF model), with its settings (rank, alpha,
// rslora, dropout). Reads and validates the adapter against `config`.
LoraPlan adapterLoraPlan(const std::filesystem::path& dir, const io::ModelConfig& config);

// Copies the adapter's weights in `dir` into a model loaded with adapterLoraPlan(dir).
void applyAdapter(const std::filesystem::path& dir, Model& model);

// Writes the model's LoRA weights as a PEFT adapter dir, each file atomically.
void writeAdapter(Model& model, const gpu::LoraSettings& settings, const std::filesystem::path& dir,
                  ExpertAdapterForm form, const std::string& base_model_name);

// Whether the adapter dir holds LoRA experts (docs/peft_formats.md §5), which PEFT and llama.cpp
// cannot load: whoever hands the adapter to them warns (or refuses) first.
bool adapterHasLoraExperts(const std::filesystem::path& dir);

// The PEFT adapter in `adapter_dir` as a llama.cpp LoRA GGUF for the base model file
// `gguf_model`, written atomically to `out`. Errors name the module and say what to do.
void exportLlamaCppAdapter(const std::filesystem::path& adapter_dir,
                           const std::filesystem::path& gguf_model,
                           const std::filesystem::path& out);

}  // namespace tandem::model
