#include "engine/model/lora_plan.h"

namespace tandem::model {

LoraPlan loraPlanFromTarget(const io::LoraTarget& target, const gpu::LoraSettings& settings) {
  LoraPlan plan;
  plan.settings = settings;
  plan.targets = [target](const std::string& name) { return target.matches(name); };
  return plan;
}

}  // namespace tandem::model
