#pragma once
// One bounded JSON parse for every input Tandem reads: requests, config.json, tokenizer.json,
// dataset rows, adapter_config.json, checkpoint state. nlohmann's parser is iterative, but a
// parsed value is copied, compared and dumped recursively, so a hostile "[[[[..." of 200 KB
// parses fine and then overflows the stack wherever it is used. Every parse therefore goes
// through here with a depth and size limit for its kind of input, and anything past them is
// refused with an Error naming the input, before a single value is built from it.

#include <cstddef>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::io {

struct JsonLimits {
  int max_depth = 0;     // containers nested inside each other, the outermost one counted
  size_t max_bytes = 0;  // of the whole text
};

// The limits per kind of input: generous for what real files nest (a JSON schema in a chat
// request or a tool definition nests a few dozen levels at most), far below what could
// exhaust a thread's stack in nlohmann's recursive copy, compare and dump.
inline constexpr JsonLimits kRequestJsonLimits{64, 64u << 20};
inline constexpr JsonLimits kModelConfigJsonLimits{32, 16u << 20};
inline constexpr JsonLimits kTokenizerJsonLimits{32, 1u << 30};
inline constexpr JsonLimits kDatasetJsonLimits{64, size_t{8} << 30};
inline constexpr JsonLimits kAdapterConfigJsonLimits{16, 16u << 20};
inline constexpr JsonLimits kStateJsonLimits{16, 256u << 20};
// Arrays of token-id rows (the input files of `tandem debug`).
inline constexpr JsonLimits kTokenIdsJsonLimits{8, 256u << 20};
// model.safetensors.index.json: a flat weight_map of up to ~100k tensors, and a metadata object.
inline constexpr JsonLimits kSafetensorsIndexJsonLimits{16, 256u << 20};

// Parses text or throws tandem::Error "<label>: ..." saying what is wrong (not JSON, nested
// deeper than limits.max_depth, larger than limits.max_bytes) and what to do.
nlohmann::json parseBoundedJson(std::string_view text, JsonLimits limits, std::string_view label);

// The same, for inputs where a bad entry is skipped rather than fatal (one line of a log):
// nullopt for anything parseBoundedJson would refuse.
std::optional<nlohmann::json> tryParseBoundedJson(std::string_view text, JsonLimits limits);

// Reads a whole file and parses it; a missing or unreadable file is an Error naming the path.
nlohmann::json readBoundedJsonFile(const std::filesystem::path& path, JsonLimits limits);

// At most max_chars of text for an error message, with "… (N bytes)" when cut: messages quote
// what the user sent, never all of it.
std::string excerptForMessage(std::string_view text, size_t max_chars = 80);

}  // namespace tandem::io
