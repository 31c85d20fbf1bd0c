#pragma once
// LLaMA-Factory's loss smoothing (extras/ploting.py `smooth`): an exponential moving average whose
// weight grows with the run length, so short runs are barely smoothed and long ones a lot. The
// CLI's training_loss.png and the studio's loss chart draw the same curve.

#include <vector>

namespace tandem::train {

// out[i] = out[i-1] * w + (1 - w) * values[i], out[-1] = values[0],
// w = 1.8 * (sigmoid(0.05 * values.size()) - 0.5).
std::vector<double> smoothLoss(const std::vector<double>& values);

}  // namespace tandem::train
