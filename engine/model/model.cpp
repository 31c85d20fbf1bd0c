#include "engine/model/model.h"

#include "engine/model/causal_lm.h"
#include "engine/model/torch_device.h"

namespace tandem::model {

Model::Model(std::unique_ptr<CausalLm> lm) : lm_(std::move(lm)) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const ModelOptions& options,
                                   const LoraPlan* lora, ThreadPool& pool) {
  return std::unique_ptr<Model>(new Model(CausalLm::load(dir, options, lora, pool)));
}

std::unique_ptr<Model> Model::random(const io::ModelConfig& config, const ModelOptions& options,
                                     const LoraPlan* lora, uint64_t seed, ThreadPool& pool,
                                     double embedding_std) {
  return std::unique_ptr<Model>(
      new Model(CausalLm::random(config, options, lora, seed, pool, embedding_std)));
}

const io::ModelConfig& Model::config() const { return lm_->config(); }
const ModelOptions& Model::options() const { return lm_->options(); }

AppliedPlacement Model::placement() const {
  AppliedPlacement applied;
  applied.embed = placementDevice(lm_->embedDevice());
  applied.head = placementDevice(lm_->headDevice());
  const int layers = lm_->config().num_hidden_layers;
  applied.layers.reserve(static_cast<size_t>(layers));
  applied.resident_experts.assign(static_cast<size_t>(layers), 0);
  for (int i = 0; i < layers; ++i)
    applied.layers.push_back(placementDevice(lm_->layerDevice(static_cast<size_t>(i))));
  lm_->visitMoeBlocks([&](size_t layer, const MoeBlock& block) {
    applied.resident_experts[layer] = block.resident_count;
  });
  return applied;
}

std::set<std::string> Model::loraLeaves() {
  std::set<std::string> leaves;
  lm_->visitLinears([&](const std::string& name, gpu::LoraLinear&) {
    leaves.insert(name.substr(name.rfind('.') + 1));
  });
  if (lm_->config().isMoe()) leaves.insert({"gate_proj", "up_proj", "down_proj"});
  return leaves;
}

void Model::writeRandomWeights(const std::filesystem::path& file, bool int8_experts) const {
  lm_->writeRandomWeights(file, int8_experts);
}

}  // namespace tandem::model
