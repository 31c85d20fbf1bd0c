#include "engine/train/loss_smoothing.h"

#include <cmath>

namespace tandem::train {

std::vector<double> smoothLoss(const std::vector<double>& values) {
  std::vector<double> out;
  if (values.empty()) return out;
  const double weight =
      1.8 * (1.0 / (1.0 + std::exp(-0.05 * static_cast<double>(values.size()))) - 0.5);
  double last = values.front();
  out.reserve(values.size());
  for (double v : values) {
    last = last * weight + (1.0 - weight) * v;
    out.push_back(last);
  }
  return out;
}

}  // namespace tandem::train
