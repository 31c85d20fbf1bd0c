#include "engine/train/training_plan.h"

#include "engine/model/model_resolver.h"

namespace tandem::train {

placement::PlanRequest planRequestFor(const TrainConfig& config, const io::ModelConfig& model) {
  placement::PlanRequest r = model::planRequestFor(config, model);
  r.lora_rank = static_cast<int>(config.lora_rank);
  r.lora_target = config.lora_target;
  r.cutoff_len = config.cutoff_len;
  r.batch_size = config.per_device_train_batch_size;
  return r;
}

placement::MemoryPlan planTraining(const TrainConfig& config, const io::ModelConfig& model,
                                   const placement::Hardware& hardware) {
  return model::planModel(planRequestFor(config, model), config,
                          model::usableHardware(config, hardware));
}

}  // namespace tandem::train
