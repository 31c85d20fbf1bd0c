#pragma once
// The tokenised dataset cached on disk, keyed by a hash of everything that changes it: the
// dataset files' bytes, tokenizer.json, the template and its options, cutoff_len, masking
// options and max_samples. A second run of the same data skips tokenisation. A damaged or
// foreign cache file is ignored (and rewritten), never trusted.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/chat/supervised_encoder.h"

namespace tandem::train {

// 16 hex digits over the files' contents and `settings` (a text of the other inputs).
std::string tokenizedCacheKey(const std::vector<std::filesystem::path>& files,
                              const std::string& settings);

// cacheDir()/tokenized (engine/core/paths.h): $TANDEM_HOME/cache/tokenized, else
// $XDG_CACHE_HOME/tandem/tokenized, else ~/.cache/tandem/tokenized.
std::filesystem::path tokenizedCacheDir();

std::optional<std::vector<chat::EncodedSample>> readTokenizedCache(
    const std::filesystem::path& file);
void writeTokenizedCache(const std::filesystem::path& file,
                         const std::vector<chat::EncodedSample>& samples);

}  // namespace tandem::train
