#pragma once
// Model: a loaded causal LM as everything outside engine/model sees it (training, generation,
// the CLI, the studio). No libtorch in here; engine/model's own code reaches the libtorch model
// (CausalLm, causal_lm.h) through lm().
//
//   auto model = Model::load(dir, resolveModelOptions(request, config, plan), &lora_plan, pool);
//   model->placement();   // where its parts ended up, to compare with the plan
//
// LoRA training (lora_training.h), KV-cached decoding (decode_session.h), adapter files
// (adapter_files.h) and adapters switched per request (adapter_set.h) work on a Model.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/model/lora_plan.h"
#include "engine/model/model_options.h"
#include "engine/placement/device.h"

namespace tandem {
class ThreadPool;
}

namespace tandem::model {

class CausalLm;

// Where a loaded model's parts live, read back from the model itself.
struct AppliedPlacement {
  placement::Device embed;
  std::vector<placement::Device> layers;  // [num layers]: attention, router, shared experts, MLP
  placement::Device head;                 // final norm and lm_head
  std::vector<int64_t> resident_experts;  // [num layers]: routed experts kept on the layer's device
};

class Model {
 public:
  // An HF model dir or a .gguf file, placed and built as `options` say; `lora` (may be null)
  // names the modules that get fresh adapters. Throws tandem::Error.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, const ModelOptions& options,
                                     const LoraPlan* lora, ThreadPool& pool);
  // A model of config's shapes with random weights (the demo's base model, tests, benchmarks);
  // embedding_std > 0 widens the embeddings (WeightLoader::synthetic).
  static std::unique_ptr<Model> random(const io::ModelConfig& config, const ModelOptions& options,
                                       const LoraPlan* lora, uint64_t seed, ThreadPool& pool,
                                       double embedding_std = 0);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const io::ModelConfig& config() const;
  const ModelOptions& options() const;
  AppliedPlacement placement() const;

  // The last name component of every module that can carry LoRA ("q_proj", "gate", ..., and
  // the routed experts' gate_proj / up_proj / down_proj): what lora_target is checked against.
  std::set<std::string> loraLeaves();

  // A random model's weights as a model.safetensors file (with random()); int8_experts: the
  // routed experts as int8 rows (WeightLoader::writeSynthesized: the e2e bench's int8 cache).
  void writeRandomWeights(const std::filesystem::path& file, bool int8_experts = false) const;

  CausalLm& lm() { return *lm_; }
  const CausalLm& lm() const { return *lm_; }

 private:
  explicit Model(std::unique_ptr<CausalLm> lm);
  std::unique_ptr<CausalLm> lm_;
};

}  // namespace tandem::model
