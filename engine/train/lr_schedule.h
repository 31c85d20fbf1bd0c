#pragma once
// Learning-rate schedules with warmup, as transformers' get_scheduler builds them (LambdaLR):
// the rate used by optimizer step k (0-based) is base_lr * factor(k).

#include <cstdint>

#include "engine/train/train_config.h"

namespace tandem::train {

struct LrSchedule {
  LrSchedulerType type = LrSchedulerType::Linear;
  double base_lr = 5e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  double at(int64_t step) const;  // learning rate of optimizer step `step` (0-based)
};

// HF's rule: warmup_steps when given (> 0), else ceil(warmup_ratio * total_steps).
int64_t warmupSteps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace tandem::train
