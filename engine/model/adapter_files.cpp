#include "engine/model/adapter_files.h"

#include "engine/io/gguf_model.h"
#include "engine/model/causal_lm.h"
#include "engine/model/gguf_lora.h"
#include "engine/model/lora_experts_files.h"
#include "engine/model/model.h"
#include "engine/model/peft_adapter.h"

namespace tandem::model {

LoraPlan adapterLoraPlan(const std::filesystem::path& dir, const io::ModelConfig& config) {
  return loraPlanFor(readAdapterAt(dir, config));
}

void applyAdapter(const std::filesystem::path& dir, Model& model) {
  applyPeftAdapter(readAdapterAt(dir, model.config()), model.lm());
}

void writeAdapter(Model& model, const gpu::LoraSettings& settings, const std::filesystem::path& dir,
                  ExpertAdapterForm form, const std::string& base_model_name) {
  writePeftAdapter(model.lm(), settings, dir, form, base_model_name);
}

bool adapterHasLoraExperts(const std::filesystem::path& dir) {
  return std::filesystem::exists(dir / kLoraExpertsConfigFile) ||
         std::filesystem::exists(dir / kLoraExpertsWeightsFile);
}

void exportLlamaCppAdapter(const std::filesystem::path& adapter_dir,
                           const std::filesystem::path& gguf_model,
                           const std::filesystem::path& out) {
  const std::unique_ptr<io::GgufModel> base = io::GgufModel::open(gguf_model);
  writeGgufLora(readPeftAdapter(adapter_dir, io::readModelConfig(base->path())), *base, out);
}

}  // namespace tandem::model
