#pragma once
// training_loss.png for `plot_loss: true`, as LLaMA-Factory writes it: the loss per logged step,
// raw and smoothed, rendered offscreen with Qt Charts (when this build has Qt).

#include <filesystem>

namespace tandem::cli {

// Reads output_dir/trainer_log.jsonl and writes output_dir/training_loss.png (atomically).
// Returns false, writing nothing, when this build has no Qt (headless builds).
bool writeLossPlot(const std::filesystem::path& output_dir);

}  // namespace tandem::cli
