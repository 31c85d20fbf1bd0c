#pragma once
// Watches the gradient norm of each optimizer step for spikes: a norm far above the running
// median of the recent steps is often the first sign of a run about to diverge (too high a
// learning_rate, a bad batch), worth a warning before the loss goes non-finite.

#include <cstddef>
#include <deque>
#include <optional>

namespace tandem::train {

class GradNormWatch {
 public:
  static constexpr size_t kWindow = 64;       // recent steps the median is taken over
  static constexpr size_t kMinSteps = 8;      // no verdict before this many
  static constexpr double kSpikeFactor = 10;  // "a spike": above this times the median

  // Records `norm` (a finite one); returns the running median it spiked above, if it did.
  std::optional<double> observe(double norm);

 private:
  std::deque<double> recent_;
};

}  // namespace tandem::train
