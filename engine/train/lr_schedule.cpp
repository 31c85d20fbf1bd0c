#include "engine/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tandem::train {

double LrSchedule::at(int64_t step) const {
  if (type == LrSchedulerType::Constant) return base_lr;
  if (step < warmup_steps) {
    return base_lr * static_cast<double>(step) /
           static_cast<double>(std::max<int64_t>(1, warmup_steps));
  }
  if (type == LrSchedulerType::ConstantWithWarmup) return base_lr;
  const double remaining = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = static_cast<double>(step - warmup_steps) / remaining;
  if (type == LrSchedulerType::Linear) {
    return base_lr * std::max(0.0, static_cast<double>(total_steps - step) / remaining);
  }
  // cosine with num_cycles = 0.5: from base_lr down to 0 over the remaining steps.
  return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
}

int64_t warmupSteps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps)));
}

}  // namespace tandem::train
