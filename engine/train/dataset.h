#pragma once
// Supervised fine-tuning data, read the way LLaMA-Factory reads it (src/llamafactory/data/parser.py
// and converter.py): a dataset is a name in <dataset_dir>/dataset_info.json, or a plain file path.
// Every row becomes one Conversation (system, tools, alternating user -> assistant messages).
//
// Formats (dataset_info.json "formatting"):
//   alpaca   columns prompt (instruction), query (input), response (output), system, history;
//            the user turn is instruction + "\n" + input (either part left out when empty), and
//            history [[q, a], ...] becomes earlier turns.
//   sharegpt columns messages (conversations), system, tools; tags role_tag (from),
//            content_tag (value), user_tag (human), assistant_tag (gpt), observation_tag
//            (observation), function_tag (function_call), system_tag (system). A leading
//            system-tagged message is the system prompt.
//   openai   sharegpt with OpenAI spellings: messages, role/content, user/assistant/system/tool.
// Files: .json (array of objects, or JSON lines), .jsonl (object per line), .csv (header row,
// RFC 4180 quoting; alpaca columns).
//
// Rows that cannot be trained on are skipped, counted and described in a DatasetReport (first five
// with their line numbers); a dataset with no usable row at all is a tandem::Error.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/conversation.h"

namespace tandem::train {

struct RowProblem {
  int64_t line = 0;
  std::string reason;
};

struct DatasetFileReport {
  std::string name;       // the name as given (dataset_info key or path)
  std::string file;       // resolved file path
  int64_t rows_read = 0;  // records looked at (after max_samples)
  int64_t rows_kept = 0;
  int64_t rows_skipped = 0;
  std::vector<RowProblem> first_problems;  // at most kMaxReportedProblems
};

struct DatasetReport {
  static constexpr size_t kMaxReportedProblems = 5;
  std::vector<DatasetFileReport> datasets;
  int64_t totalKept() const;
  int64_t totalSkipped() const;
  std::string summary() const;  // human-readable, several lines
};

// Loads and concatenates the named datasets, in order. A name is looked up in
// dataset_dir/dataset_info.json first; a name that is not a key there but names an existing
// .json/.jsonl/.csv file (absolute, or relative to dataset_dir, or to the working directory) is
// read as a plain file. max_samples, as in LLaMA-Factory, keeps the first N records of EACH
// dataset before bad rows are dropped. Throws tandem::Error on unknown names, missing or unreadable
// files, invalid JSON/CSV, and datasets without a single usable row.
std::vector<chat::Conversation> loadDatasets(const std::filesystem::path& dataset_dir,
                                             const std::vector<std::string>& names,
                                             std::optional<int64_t> max_samples,
                                             DatasetReport& report);

// "a, b,c" -> {"a", "b", "c"} (LLaMA-Factory's `dataset: a,b` spelling).
std::vector<std::string> splitDatasetNames(std::string_view comma_list);

// RFC 4180 CSV: fields separated by ',', records by CRLF or LF; a field in double quotes may hold
// commas, line breaks and "" (one quote). A UTF-8 BOM at the start is skipped. A trailing line
// break does not make an empty record. Throws tandem::Error (with the line) on a quote that is
// never closed or text after a closing quote.
struct CsvRecord {
  std::vector<std::string> fields;
  int64_t line = 0;  // 1-based line where the record starts
};
std::vector<CsvRecord> parseCsv(std::string_view text, std::string_view label);

}  // namespace tandem::train
