#include "engine/train/split_calibration.h"

#include "engine/core/thread_pool.h"
#include "engine/model/cost_calibration.h"

namespace tandem::train {

namespace {

// The experts' LoRA rank as the model builds it (causal_lm_builder.cpp): 0 when no projection of
// the routed experts is targeted. The calibration times the engine with it (its key names it).
int expertLoraRank(const io::ModelConfig& model, const model::LoraPlan& lora) {
  if (!lora.targets) return 0;
  for (int layer = 0; layer < model.num_hidden_layers; ++layer) {
    if (!model.isMoeLayer(layer)) continue;
    const std::string experts = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      if (lora.targets(experts + proj))
        return lora.expert_rank > 0 ? lora.expert_rank : lora.settings.rank;
    }
    return 0;
  }
  return 0;
}

}  // namespace

void calibrateExpertSplit(model::ModelOptions& options, const model::ModelRequest& request,
                          const io::ModelConfig& model, const model::LoraPlan& lora,
                          const std::function<void(const std::string&)>& log,
                          const std::filesystem::path& cache_dir) {
  if (options.experts != model::ExpertsMode::Auto ||
      options.expert_split != model::ExpertSplitChoice::Balance || !model.isMoe())
    return;
  model::CalibrationOptions calibration;
  calibration.hidden = model.hidden_size;
  calibration.intermediate = model.moe_intermediate_size;
  calibration.expert_lora_rank = expertLoraRank(model, lora);
  // As `tandem plan` asks (plan_cost_model.cpp), so both read one cache file.
  calibration.formats = {"bf16"};
  if (request.experts_format == "int8") calibration.formats.push_back("int8");
  calibration.cache_dir = cache_dir;
  options.expert_split_rates =
      model::calibrateAtStartup(calibration, ThreadPool::global(), log).rates;
}

}  // namespace tandem::train
