#pragma once
// The rows of one dataset file as JSON values with their line numbers, before any conversion:
// .json (an array, or JSON lines as Hugging Face's loader also accepts), .jsonl and .csv. Each
// JSON row is parsed on its own within io::kDatasetJsonLimits, so a hostile row (nested 100k deep)
// is that row's error and never a value anything recurses through.

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/io/bounded_json.h"

namespace tandem::train {

struct DatasetRecord {
  nlohmann::json value;
  int64_t line = 0;     // 1-based line where the row starts
  int64_t index = 0;    // 0-based position in the file
  std::string refused;  // why the row was not even parsed (nested too deep): a bad row
};

// The whole file; an Error naming it when it cannot be read.
std::string readDatasetText(const std::filesystem::path& file);

// Throws the syntax error of `json` (a part of `text` from byte `base`, or its line
// `base_line`), with its line, if it is not JSON. Builds no value (a SAX pass).
void requireJson(std::string_view json, const std::string& label, std::string_view text,
                 size_t base, int64_t base_line);

// .json, .jsonl or .csv (any case).
bool isSupportedDatasetFile(const std::filesystem::path& file);

// The file's rows; a file that is not JSON (or CSV) at all is an Error with the line.
std::vector<DatasetRecord> readDatasetRecords(const std::filesystem::path& file);

}  // namespace tandem::train
