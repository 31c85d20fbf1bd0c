#include "engine/train/dataset.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>

#include "engine/core/error.h"
#include "engine/io/bounded_json.h"
#include "engine/train/dataset_records.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

enum class Formatting : uint8_t { Alpaca, Sharegpt };

// LLaMA-Factory's DatasetAttr, reduced to what SFT from local files needs. The defaults are
// parser.py's; "openai" formatting is sharegpt with OpenAI spellings.
struct DatasetAttr {
  std::string name;
  fs::path file;
  Formatting formatting = Formatting::Alpaca;
  // alpaca columns
  std::string prompt = "instruction", query = "input", response = "output", history;
  // sharegpt columns
  std::string messages = "conversations";
  // both
  std::string system, tools;
  // sharegpt tags
  std::string role_tag = "from", content_tag = "value", user_tag = "human", assistant_tag = "gpt",
              observation_tag = "observation", function_tag = "function_call",
              system_tag = "system";
};

void useOpenAiSpellings(DatasetAttr& attr) {
  attr.formatting = Formatting::Sharegpt;
  attr.messages = "messages";
  attr.role_tag = "role";
  attr.content_tag = "content";
  attr.user_tag = "user";
  attr.assistant_tag = "assistant";
  attr.observation_tag = "tool";
  attr.system_tag = "system";
}

using Record = DatasetRecord;

// ---- conversion ------------------------------------------------------------------------------

using Converted = std::variant<chat::Conversation, std::string>;  // a conversation or why not

// A column may be absent or null; otherwise it must be a string.
std::optional<std::string> optionalString(const Json& row, const std::string& column,
                                          std::string& error) {
  if (column.empty()) return std::string();
  auto it = row.find(column);
  if (it == row.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    error = "\"" + column + "\" is not a string";
    return std::nullopt;
  }
  return it->get<std::string>();
}

std::optional<std::string> toolsText(const Json& row, const std::string& column,
                                     std::string& error) {
  if (column.empty()) return std::string();
  auto it = row.find(column);
  if (it == row.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array() || it->is_object()) return it->dump();
  error = "\"" + column + "\" is not a string or JSON list";
  return std::nullopt;
}

Converted convertAlpaca(const Json& row, const DatasetAttr& attr) {
  if (!row.is_object()) {
    if (row.is_string()) return row.get<std::string>();  // csv field-count message
    return std::string("not a JSON object");
  }
  chat::Conversation conv;
  std::string error;
  if (!attr.history.empty() && row.contains(attr.history) && !row[attr.history].is_null()) {
    const Json& history = row[attr.history];
    if (!history.is_array()) return "\"" + attr.history + "\" is not a list of [prompt, response]";
    for (const Json& pair : history) {
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
        return "\"" + attr.history + "\" entries must be [prompt, response] string pairs";
      conv.messages.push_back({chat::Role::User, pair[0].get<std::string>()});
      conv.messages.push_back({chat::Role::Assistant, pair[1].get<std::string>()});
    }
  }
  if (!row.contains(attr.prompt)) return "missing \"" + attr.prompt + "\"";
  auto prompt = optionalString(row, attr.prompt, error);
  auto query = optionalString(row, attr.query, error);
  if (!prompt || !query) return error;
  // converter.py: "\n".join of the non-empty parts.
  std::string user = *prompt;
  if (!query->empty()) user = user.empty() ? *query : user + "\n" + *query;
  if (user.empty()) return "\"" + attr.prompt + "\" and \"" + attr.query + "\" are both empty";

  auto response_it = row.find(attr.response);
  if (response_it == row.end() || response_it->is_null())
    return "missing \"" + attr.response + "\"";
  if (!response_it->is_string()) return "\"" + attr.response + "\" is not a string";
  conv.messages.push_back({chat::Role::User, std::move(user)});
  conv.messages.push_back({chat::Role::Assistant, response_it->get<std::string>()});

  auto system = optionalString(row, attr.system, error);
  auto tools = toolsText(row, attr.tools, error);
  if (!system || !tools) return error;
  conv.system = std::move(*system);
  conv.tools = std::move(*tools);
  return conv;
}

Converted convertSharegpt(const Json& row, const DatasetAttr& attr) {
  if (!row.is_object()) return std::string("not a JSON object");
  auto it = row.find(attr.messages);
  if (it == row.end() || it->is_null()) return "missing \"" + attr.messages + "\"";
  if (!it->is_array()) return "\"" + attr.messages + "\" is not a list";
  const Json& messages = *it;
  if (messages.empty()) return std::string("empty conversation");

  chat::Conversation conv;
  std::string error;
  size_t first = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string where = "message " + std::to_string(i + 1) + ": ";
    if (!m.is_object()) return where + "not an object";
    auto role = m.find(attr.role_tag);
    auto content = m.find(attr.content_tag);
    if (role == m.end() || !role->is_string()) return where + "no string \"" + attr.role_tag + "\"";
    if (content == m.end() || !content->is_string())
      return where + "no string \"" + attr.content_tag + "\"";
  }
  if (!attr.system_tag.empty() && messages[0][attr.role_tag] == attr.system_tag) {
    conv.system = messages[0][attr.content_tag].get<std::string>();
    first = 1;
  } else {
    auto system = optionalString(row, attr.system, error);
    if (!system) return error;
    conv.system = std::move(*system);
  }
  if (first == messages.size()) return std::string("empty conversation (only a system message)");

  for (size_t i = first; i < messages.size(); ++i) {
    const std::string role = messages[i][attr.role_tag].get<std::string>();
    const bool prompt_side = (i - first) % 2 == 0;
    chat::Role mapped;
    if (prompt_side && role == attr.user_tag)
      mapped = chat::Role::User;
    else if (prompt_side && role == attr.observation_tag)
      mapped = chat::Role::Observation;
    else if (!prompt_side && role == attr.assistant_tag)
      mapped = chat::Role::Assistant;
    else if (!prompt_side && role == attr.function_tag)
      mapped = chat::Role::FunctionCall;
    else
      return "message " + std::to_string(i + 1) + ": expected " +
             (prompt_side ? "'" + attr.user_tag + "' or '" + attr.observation_tag + "'"
                          : "'" + attr.assistant_tag + "' or '" + attr.function_tag + "'") +
             ", got '" + role + "' (turns must alternate user -> assistant)";
    conv.messages.push_back({mapped, messages[i][attr.content_tag].get<std::string>()});
  }
  if (conv.messages.size() % 2 != 0)
    return std::string("the last message is not an assistant turn");

  auto tools = toolsText(row, attr.tools, error);
  if (!tools) return error;
  conv.tools = std::move(*tools);
  return conv;
}

// ---- dataset_info.json -----------------------------------------------------------------------

std::string stringField(const Json& obj, const char* key, const std::string& fallback,
                        const std::string& label) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string())
    throw Error(label + ": \"" + key + "\" must be a string", "fix dataset_info.json");
  return it->get<std::string>();
}

DatasetAttr parseEntry(const std::string& name, const Json& entry, const fs::path& dataset_dir) {
  const std::string label =
      (dataset_dir / "dataset_info.json").string() + ": dataset '" + name + "'";
  if (!entry.is_object()) throw Error(label + " is not an object", "fix dataset_info.json");
  for (const char* remote :
       {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"})
    if (entry.contains(remote) && !entry.contains("file_name"))
      throw Error(label + " is remote (\"" + std::string(remote) + "\")",
                  "Tandem reads local files only: download the data and set \"file_name\"");
  if (!entry.contains("file_name")) throw Error(label + " has no \"file_name\"", "add one");
  if (entry.value("ranking", false))
    throw Error(label + " is a preference (ranking) dataset", "SFT needs a supervised dataset");

  DatasetAttr attr;
  attr.name = name;
  attr.file = dataset_dir / stringField(entry, "file_name", "", label);
  std::string formatting = stringField(entry, "formatting", "alpaca", label);
  if (formatting == "sharegpt")
    attr.formatting = Formatting::Sharegpt;
  else if (formatting == "openai")
    useOpenAiSpellings(attr);
  else if (formatting != "alpaca")
    throw Error(label + ": unknown formatting '" + formatting + "'",
                "use \"alpaca\", \"sharegpt\" or \"openai\"");

  const Json empty = Json::object();
  const Json& columns = entry.contains("columns") ? entry["columns"] : empty;
  const Json& tags = entry.contains("tags") ? entry["tags"] : empty;
  if (!columns.is_object() || !tags.is_object())
    throw Error(label + ": \"columns\" and \"tags\" must be objects", "fix dataset_info.json");
  attr.prompt = stringField(columns, "prompt", attr.prompt, label);
  attr.query = stringField(columns, "query", attr.query, label);
  attr.response = stringField(columns, "response", attr.response, label);
  attr.history = stringField(columns, "history", attr.history, label);
  attr.messages = stringField(columns, "messages", attr.messages, label);
  attr.system = stringField(columns, "system", attr.system, label);
  attr.tools = stringField(columns, "tools", attr.tools, label);
  attr.role_tag = stringField(tags, "role_tag", attr.role_tag, label);
  attr.content_tag = stringField(tags, "content_tag", attr.content_tag, label);
  attr.user_tag = stringField(tags, "user_tag", attr.user_tag, label);
  attr.assistant_tag = stringField(tags, "assistant_tag", attr.assistant_tag, label);
  attr.observation_tag = stringField(tags, "observation_tag", attr.observation_tag, label);
  attr.function_tag = stringField(tags, "function_tag", attr.function_tag, label);
  attr.system_tag = stringField(tags, "system_tag", attr.system_tag, label);
  return attr;
}

std::optional<Json> readDatasetInfo(const fs::path& dataset_dir) {
  const fs::path path = dataset_dir / "dataset_info.json";
  if (!fs::exists(path)) return std::nullopt;
  std::string text = readDatasetText(path);
  requireJson(text, path.string(), text, 0, 0);
  Json info = io::parseBoundedJson(text, io::kDatasetJsonLimits, path.string());
  if (!info.is_object())
    throw Error(path.string() + ": expected a JSON object", "see LLaMA-Factory's data/README.md");
  return info;
}

std::optional<fs::path> findPlainFile(const fs::path& dataset_dir, const std::string& name) {
  for (const fs::path& candidate : {dataset_dir / name, fs::path(name)})
    if (isSupportedDatasetFile(candidate) && fs::is_regular_file(candidate)) return candidate;
  return std::nullopt;
}

// A plain file: alpaca, unless its first record looks like sharegpt or OpenAI messages.
DatasetAttr attrForPlainFile(const std::string& name, const fs::path& file,
                             const std::vector<Record>& records) {
  DatasetAttr attr;
  attr.name = name;
  attr.file = file;
  attr.system = "system";
  attr.history = "history";
  attr.tools = "tools";
  if (!records.empty() && records.front().value.is_object()) {
    const Json& first = records.front().value;
    if (first.contains("conversations"))
      attr.formatting = Formatting::Sharegpt;
    else if (first.contains("messages"))
      useOpenAiSpellings(attr);
  }
  return attr;
}

std::string knownNames(const Json& info) {
  std::string names;
  for (auto it = info.begin(); it != info.end(); ++it)
    names += (names.empty() ? "" : ", ") + it.key();
  return names.empty() ? "(none)" : names;
}

std::vector<fs::path> filesOf(const fs::path& path) {
  if (!fs::exists(path))
    throw Error("dataset file not found: " + path.string(),
                "check \"file_name\" in dataset_info.json (relative to dataset_dir)");
  if (!fs::is_directory(path)) return {path};
  std::vector<fs::path> files;  // a folder: every supported file in it, like LLaMA-Factory
  for (const auto& e : fs::directory_iterator(path))
    if (e.is_regular_file() && isSupportedDatasetFile(e.path())) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw Error("no .json/.jsonl/.csv files in " + path.string(), "");
  return files;
}

void convertInto(const DatasetAttr& attr, const fs::path& file, std::vector<Record> records,
                 int64_t& budget, DatasetFileReport& rep, std::vector<chat::Conversation>& out) {
  for (Record& record : records) {
    if (budget == 0) break;
    --budget;
    ++rep.rows_read;
    Converted c = !record.refused.empty()                 ? Converted(record.refused)
                  : attr.formatting == Formatting::Alpaca ? convertAlpaca(record.value, attr)
                                                          : convertSharegpt(record.value, attr);
    if (auto* reason = std::get_if<std::string>(&c)) {
      ++rep.rows_skipped;
      if (rep.first_problems.size() < DatasetReport::kMaxReportedProblems)
        rep.first_problems.push_back({record.line, *reason});
      continue;
    }
    chat::Conversation& conv = std::get<chat::Conversation>(c);
    conv.source = {file.string(), record.line, record.index};
    out.push_back(std::move(conv));
    ++rep.rows_kept;
  }
}

std::string problemList(const DatasetFileReport& rep) {
  std::string text;
  for (const RowProblem& p : rep.first_problems)
    text += "\n  line " + std::to_string(p.line) + ": " + p.reason;
  return text;
}

}  // namespace

int64_t DatasetReport::totalKept() const {
  int64_t n = 0;
  for (const auto& d : datasets) n += d.rows_kept;
  return n;
}

int64_t DatasetReport::totalSkipped() const {
  int64_t n = 0;
  for (const auto& d : datasets) n += d.rows_skipped;
  return n;
}

std::string DatasetReport::summary() const {
  std::string text;
  for (const auto& d : datasets) {
    text += d.name + " (" + d.file + "): " + std::to_string(d.rows_read) + " rows, " +
            std::to_string(d.rows_kept) + " kept, " + std::to_string(d.rows_skipped) + " skipped";
    text += problemList(d) + "\n";
  }
  return text;
}

std::vector<std::string> splitDatasetNames(std::string_view comma_list) {
  std::vector<std::string> names;
  size_t pos = 0;
  while (pos <= comma_list.size()) {
    size_t end = std::min(comma_list.find(',', pos), comma_list.size());
    std::string_view part = comma_list.substr(pos, end - pos);
    size_t b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
    if (b != std::string_view::npos) names.emplace_back(part.substr(b, e - b + 1));
    pos = end + 1;
  }
  return names;
}

std::vector<chat::Conversation> loadDatasets(const std::filesystem::path& dataset_dir,
                                             const std::vector<std::string>& names,
                                             std::optional<int64_t> max_samples,
                                             DatasetReport& report) {
  if (names.empty()) throw Error("no dataset given", "set `dataset: name1,name2` in the config");
  std::optional<Json> info = readDatasetInfo(dataset_dir);
  std::vector<chat::Conversation> out;
  for (const std::string& name : names) {
    DatasetAttr attr;
    std::vector<fs::path> files;
    if (info && info->contains(name)) {
      attr = parseEntry(name, (*info)[name], dataset_dir);
      files = filesOf(attr.file);
    } else if (auto plain = findPlainFile(dataset_dir, name)) {
      files = {*plain};
    } else if (info) {
      throw Error("unknown dataset '" + name + "'",
                  (dataset_dir / "dataset_info.json").string() + " defines: " + knownNames(*info));
    } else {
      throw Error("unknown dataset '" + name + "': it is not a .json/.jsonl/.csv file and " +
                      (dataset_dir / "dataset_info.json").string() + " does not exist",
                  "give a file path, or set dataset_dir to a folder with dataset_info.json");
    }

    DatasetFileReport rep;
    rep.name = name;
    rep.file = files.size() == 1 ? files[0].string() : attr.file.string();
    int64_t budget = max_samples.value_or(-1);  // -1: unlimited
    for (const fs::path& file : files) {
      std::vector<Record> records = readDatasetRecords(file);
      if (attr.name.empty()) attr = attrForPlainFile(name, file, records);
      convertInto(attr, file, std::move(records), budget, rep, out);
    }
    if (rep.rows_kept == 0) {
      throw Error("dataset '" + name + "' (" + rep.file + ") has no usable rows (" +
                      std::to_string(rep.rows_read) + " read)" + problemList(rep),
                  "check \"formatting\", \"columns\" and \"tags\" for it in dataset_info.json");
    }
    report.datasets.push_back(std::move(rep));
  }
  return out;
}

}  // namespace tandem::train
