#pragma once
// experts_mode auto prices each expert with this machine's calibrated rates (the cost model,
// engine/placement/step_cost.h): measured once, at the first training start-up on a machine that
// has no calibration for the model's expert shape (model::calibrateAtStartup, about a second),
// read from the calibration cache after. The cycling diagnostic split uses no rates: nothing is
// measured for it.

#include <filesystem>
#include <functional>
#include <string>

#include "engine/io/model_config.h"
#include "engine/model/lora_plan.h"
#include "engine/model/model_options.h"
#include "engine/model/model_request.h"

namespace tandem::train {

// Sets options.expert_split_rates when options.experts is Auto (else does nothing); `log` gets
// the calibration's progress line and result. cache_dir empty: cacheDir().
void calibrateExpertSplit(model::ModelOptions& options, const model::ModelRequest& request,
                          const io::ModelConfig& model, const model::LoraPlan& lora,
                          const std::function<void(const std::string&)>& log,
                          const std::filesystem::path& cache_dir = {});

}  // namespace tandem::train
