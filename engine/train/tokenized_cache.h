#pragma once
// The tokenised dataset cached on disk, keyed by a hash of everything that changes it: the
// conversations as converted from the dataset files (so dataset_info.json's columns, tags and
// formatting, and every file of a directory dataset, count through what they produced), the
// tokenizer files (tokenizer.json, tokenizer_config.json), the template and its options,
// cutoff_len and the masking options, and the key's format version. A second run of the same
// data skips tokenisation. A damaged or foreign cache file is ignored (and rewritten), never
// trusted.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/chat/conversation.h"
#include "engine/chat/supervised_encoder.h"

namespace tandem::train {

// 16 hex digits over the conversations (in order), the tokenizer files' contents and
// `settings` (a text of the other inputs).
std::string tokenizedCacheKey(const std::vector<chat::Conversation>& conversations,
                              const std::vector<std::filesystem::path>& tokenizer_files,
                              const std::string& settings);

// cacheDir()/tokenized (engine/core/paths.h): $TANDEM_HOME/cache/tokenized, else
// $XDG_CACHE_HOME/tandem/tokenized, else ~/.cache/tandem/tokenized.
std::filesystem::path tokenizedCacheDir();

std::optional<std::vector<chat::EncodedSample>> readTokenizedCache(
    const std::filesystem::path& file);
void writeTokenizedCache(const std::filesystem::path& file,
                         const std::vector<chat::EncodedSample>& samples);

}  // namespace tandem::train
