#include "engine/train/training_plan.h"

#include "engine/model/model_resolver.h"

namespace tandem::train {

placement::PlanRequest planRequestFor(const TrainConfig& config, const io::ModelConfig& model) {
  placement::PlanRequest r = model::planRequestFor(config, model);
  r.lora_rank = static_cast<int>(config.lora_rank);
  r.lora_target = config.lora_target;
  r.cutoff_len = config.cutoff_len;
  r.batch_size = config.per_device_train_batch_size;
  // KT-FT's finding (issue 32): LoRA experts use the spare GPU memory better than resident hot
  // experts, so auto for both gives it all to LE; gpu_experts: N still reserves N.
  if (config.lora_experts == "auto" && config.gpu_experts == "auto") r.gpu_experts = 0;
  return r;
}

placement::LoraExpertsChoice loraExpertsFor(const TrainConfig& config, const io::ModelConfig& model,
                                            const placement::MemoryPlan& plan) {
  const int64_t requested =
      config.lora_experts == "auto" ? placement::kAutoLoraExperts : std::stoll(config.lora_experts);
  if (model.num_experts <= 0) return {};  // a dense model has no MoE block to add LE to
  return placement::chooseLoraExperts(plan, planRequestFor(config, model), requested,
                                      config.le_dim);
}

placement::MemoryPlan planTraining(const TrainConfig& config, const io::ModelConfig& model,
                                   const placement::Hardware& hardware) {
  placement::MemoryPlan plan = model::planModel(planRequestFor(config, model), config,
                                                model::usableHardware(config, hardware));
  placement::addLoraExpertsToPlan(plan, planRequestFor(config, model),
                                  loraExpertsFor(config, model, plan));
  return plan;
}

placement::SequenceFit sequenceFitFor(const TrainConfig& config, const io::ModelConfig& model,
                                      const placement::MemoryPlan& plan,
                                      const placement::Hardware& hardware) {
  return placement::longestSequenceThatFits(planRequestFor(config, model),
                                            model::usableHardware(config, hardware), plan);
}

std::string longestSequenceAdvice(const TrainConfig& config, const io::ModelConfig& model,
                                  const placement::MemoryPlan& plan,
                                  const placement::Hardware& hardware) {
  return placement::outOfMemoryAdvice(sequenceFitFor(config, model, plan, hardware));
}

}  // namespace tandem::train
