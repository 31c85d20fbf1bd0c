#pragma once
// The wizard's starting point for the next fine-tune: the settings of the newest training run in
// the run store (its recorded YAML), as a new run: its own output folder next to the old one,
// no resume, no overwrite. The old run's folder (adapter, checkpoints) is never a target.

#include <filesystem>
#include <optional>

#include "engine/train/train_config.h"

namespace tandem::store {
class RunStore;
}

namespace tandem::ui {

// `run`'s settings for the next run: a fresh output folder (never `run`'s own, even before the
// run has made it), no resume, no overwrite.
train::TrainConfig nextRunConfig(const train::TrainConfig& run);

// nextRunConfig of the newest training run in `store`. nullopt when the store holds no training run
// whose YAML still parses (a run recorded by another version may not); never throws for that.
// Throws tandem::Error when the store cannot be read.
std::optional<train::TrainConfig> lastRunConfig(const store::RunStore& store);

// `dir` when nothing is there yet, else the first free "<dir>-2", "<dir>-3", … ("run-2" gives
// "run-3").
// `also_taken` counts as existing too.
std::filesystem::path freshOutputDir(const std::filesystem::path& dir,
                                     const std::filesystem::path& also_taken = {});

}  // namespace tandem::ui
