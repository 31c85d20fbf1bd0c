#include "engine/train/dataset_records.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <optional>
#include <sstream>

#include "engine/core/error.h"
#include "engine/train/dataset.h"

namespace tandem::train {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// 1-based line of a byte offset, from the sorted offsets of '\n'.
class LineIndex {
 public:
  explicit LineIndex(std::string_view text) {
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\n') newlines_.push_back(i);
  }
  int64_t lineOf(size_t offset) const {
    return 1 + (std::lower_bound(newlines_.begin(), newlines_.end(), offset) - newlines_.begin());
  }

 private:
  std::vector<size_t> newlines_;
};

// A row valid as JSON but nested past kDatasetJsonLimits (a hostile "tools" 100k deep) is one
// bad row, reported with its line; its value is never built, so nothing recurses through it.
DatasetRecord boundedRow(std::string_view text, int64_t line, int64_t index) {
  if (std::optional<Json> value = io::tryParseBoundedJson(text, io::kDatasetJsonLimits))
    return {std::move(*value), line, index, {}};
  return {Json(), line, index,
          "nested deeper than " + std::to_string(io::kDatasetJsonLimits.max_depth) +
              " levels (or larger than the row limit)"};
}

[[noreturn]] void throwJsonError(const std::string& label, std::string_view text, size_t base,
                                 int64_t base_line, const Json::parse_error& e) {
  // e.byte counts the bytes read, so the offending byte is at e.byte - 1.
  size_t offset = base + (e.byte > 0 ? e.byte - 1 : 0);
  int64_t line = base_line;
  if (base_line == 0) line = LineIndex(text).lineOf(std::min(offset, text.size()));
  std::string what = e.what();
  throw Error(label + ":" + std::to_string(line) + ": invalid JSON (" + what + ")",
              "fix the file; every record must be a JSON object");
}

// A SAX pass over JSON that builds no value and keeps the first syntax error: where a file stops
// being JSON is found without ever holding what it nests.
struct SyntaxCheck : nlohmann::json_sax<Json> {
  std::optional<Json::parse_error> error;
  std::string other;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    if (const auto* p = dynamic_cast<const Json::parse_error*>(&e)) error.emplace(*p);
    other = e.what();  // a number out of range
    return false;
  }
};

// Offsets where the elements of the top-level array that opens at `open` begin. The text was
// already validated by nlohmann, so a plain scan over strings and brackets is enough.
std::vector<size_t> arrayElementOffsets(std::string_view text, size_t open, size_t& close) {
  std::vector<size_t> offsets;
  close = text.size();
  int depth = 0;
  bool in_string = false, escape = false, expecting = true;
  for (size_t i = open; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (escape)
        escape = false;
      else if (c == '\\')
        escape = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    if (c == ',') {
      if (depth == 1) expecting = true;
      continue;
    }
    if (c == ']' || c == '}') {
      if (--depth == 0) {
        close = i;
        break;
      }
      continue;
    }
    if (depth == 1 && expecting) {
      offsets.push_back(i);
      expecting = false;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{')
      ++depth;
  }
  return offsets;
}

size_t skipBomAndSpace(std::string_view text) {
  size_t i = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  return i;
}

// The text of one array element: from its start to the next one's (or the closing bracket),
// without the separating comma and spaces.
std::string_view elementText(std::string_view text, size_t begin, size_t end) {
  std::string_view element = text.substr(begin, end - begin);
  while (!element.empty() &&
         (std::isspace(static_cast<unsigned char>(element.back())) || element.back() == ','))
    element.remove_suffix(1);
  return element;
}

std::vector<DatasetRecord> readJsonArray(std::string_view text, size_t open,
                                         const std::string& label) {
  // Validated whole without building a value (nlohmann's parser is iterative); then each row is
  // parsed on its own, bounded, so a hostile row is that row's error and not the file's.
  requireJson(text.substr(open), label, text, open, 0);
  size_t close = 0;
  const std::vector<size_t> offsets = arrayElementOffsets(text, open, close);
  LineIndex lines(text);
  std::vector<DatasetRecord> records;
  records.reserve(offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) {
    const size_t end = i + 1 < offsets.size() ? offsets[i + 1] : close;
    records.push_back(boundedRow(elementText(text, offsets[i], end), lines.lineOf(offsets[i]),
                                 static_cast<int64_t>(i)));
  }
  return records;
}

std::vector<DatasetRecord> readJsonLines(std::string_view text, const std::string& label) {
  std::vector<DatasetRecord> records;
  size_t pos = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;
  int64_t line = 1;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view row = text.substr(pos, end - pos);
    if (row.find_first_not_of(" \t\r") != std::string_view::npos) {
      requireJson(row, label, text, 0, line);
      records.push_back(boundedRow(row, line, static_cast<int64_t>(records.size())));
    }
    pos = end + 1;
    ++line;
  }
  return records;
}

std::vector<DatasetRecord> readCsv(std::string_view text, const std::string& label) {
  std::vector<CsvRecord> rows = parseCsv(text, label);
  if (rows.empty()) return {};
  const std::vector<std::string>& header = rows.front().fields;
  std::vector<DatasetRecord> records;
  for (size_t r = 1; r < rows.size(); ++r) {
    const CsvRecord& row = rows[r];
    DatasetRecord record{Json::object(), row.line, static_cast<int64_t>(r - 1)};
    if (row.fields.size() > header.size()) {
      // Not an object: the converter reports it as a bad row with this text.
      record.value = "has " + std::to_string(row.fields.size()) + " fields but the header has " +
                     std::to_string(header.size());
    } else {
      for (size_t c = 0; c < row.fields.size(); ++c) record.value[header[c]] = row.fields[c];
    }
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace

std::string readDatasetText(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw Error("cannot read dataset file " + file.string(), "check the path and permissions");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Throws the syntax error of `json` (a part of `text` from `base`, or its line `base_line`)
// with its line, if it is not JSON.
void requireJson(std::string_view json, const std::string& label, std::string_view text,
                 size_t base, int64_t base_line) {
  SyntaxCheck check;
  if (Json::sax_parse(json, &check)) return;
  if (check.error) throwJsonError(label, text, base, base_line, *check.error);
  throw Error(label + (base_line > 0 ? ":" + std::to_string(base_line) : std::string()) +
                  ": invalid JSON (" + check.other + ")",
              "fix the file; every record must be a JSON object");
}

bool isSupportedDatasetFile(const fs::path& file) {
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
  return ext == ".json" || ext == ".jsonl" || ext == ".csv";
}

std::vector<DatasetRecord> readDatasetRecords(const fs::path& file) {
  const std::string label = file.string();
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
  std::string text = readDatasetText(file);
  if (ext == ".csv") return readCsv(text, label);
  if (ext != ".json" && ext != ".jsonl")
    throw Error(label + ": unsupported file type '" + ext + "'", "use .json, .jsonl or .csv");
  // Like Hugging Face's json loader, accept an array or JSON lines under either extension.
  size_t first = skipBomAndSpace(text);
  if (first < text.size() && text[first] == '[') return readJsonArray(text, first, label);
  return readJsonLines(text, label);
}

std::vector<CsvRecord> parseCsv(std::string_view text, std::string_view label) {
  std::vector<CsvRecord> records;
  size_t i = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;
  int64_t line = 1;
  const size_t n = text.size();
  while (i < n) {
    CsvRecord record;
    record.line = line;
    bool end_of_record = false;
    while (!end_of_record) {
      std::string field;
      if (i < n && text[i] == '"') {
        const int64_t open_line = line;
        ++i;
        for (;;) {
          if (i >= n)
            throw Error(std::string(label) + ":" + std::to_string(open_line) +
                            ": quoted CSV field is never closed",
                        "close the quote; a quote inside a quoted field is written \"\"");
          char c = text[i++];
          if (c == '"') {
            if (i < n && text[i] == '"') {
              field += '"';
              ++i;
              continue;
            }
            break;
          }
          if (c == '\n') ++line;
          field += c;
        }
        if (i < n && text[i] != ',' && text[i] != '\n' && !(text[i] == '\r')) {
          throw Error(std::string(label) + ":" + std::to_string(line) +
                          ": text after the closing quote of a CSV field",
                      "quote the whole field, and write a quote inside it as \"\"");
        }
      } else {
        while (i < n && text[i] != ',' && text[i] != '\n' && text[i] != '\r') field += text[i++];
      }
      record.fields.push_back(std::move(field));
      if (i < n && text[i] == ',') {
        ++i;
        continue;
      }
      // End of record: CRLF, LF, a lone CR, or the end of the text.
      if (i < n && text[i] == '\r') ++i;
      if (i < n && text[i] == '\n') ++i;
      ++line;
      end_of_record = true;
    }
    const bool blank = record.fields.size() == 1 && record.fields[0].empty();
    if (!blank) records.push_back(std::move(record));
  }
  return records;
}

}  // namespace tandem::train
