#pragma once
// What a training output dir holds, as every reader of one finds it: checkpoint-N dirs (complete
// once their trainer_state.json, written last, is there) and the final adapter. Torch-free.

#include <cstdint>
#include <filesystem>
#include <optional>

namespace tandem::model {

// N of a "checkpoint-N" dir name; nullopt for any other name (user dirs that merely look alike).
std::optional<int64_t> checkpointStep(const std::filesystem::path& dir);

// The newest complete checkpoint-N in output_dir, or empty.
std::filesystem::path lastCheckpoint(const std::filesystem::path& output_dir);

// A PEFT adapter dir as given, or the adapter inside a Tandem training output / checkpoint dir.
// Throws tandem::Error naming what was looked for.
std::filesystem::path resolveAdapterDir(const std::filesystem::path& dir);

}  // namespace tandem::model
