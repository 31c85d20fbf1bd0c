#include "engine/train/grad_norm_watch.h"

#include <algorithm>
#include <vector>

namespace tandem::train {

std::optional<double> GradNormWatch::observe(double norm) {
  std::optional<double> spiked_above;
  if (recent_.size() >= kMinSteps) {
    std::vector<double> sorted(recent_.begin(), recent_.end());
    const auto middle = sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2);
    std::nth_element(sorted.begin(), middle, sorted.end());
    // A median of 0 (no gradient yet, e.g. LoRA B still 0) says nothing about scale.
    if (*middle > 0 && norm > kSpikeFactor * *middle) spiked_above = *middle;
  }
  recent_.push_back(norm);
  if (recent_.size() > kWindow) recent_.pop_front();
  return spiked_above;
}

}  // namespace tandem::train
