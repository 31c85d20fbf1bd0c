// libFuzzer target for the dataset reader (engine/train/dataset.cpp) through its public API,
// loadDatasets. The first byte picks the file kind and the dataset_info.json formatting; the rest
// is the file's content. Bad rows are counted, a dataset without a usable row is a tandem::Error;
// anything else (a crash, a sanitizer finding, another exception) is a bug.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/core/error.h"
#include "engine/train/dataset.h"

namespace {

namespace fs = std::filesystem;

struct Kind {
  const char* name;  // the dataset_info.json key
  const char* file;  // the file it names
};
// alpaca (.json array, .jsonl, .csv), sharegpt (.jsonl, custom tags), openai (.json).
constexpr Kind kKinds[] = {{"alpaca_json", "a.json"},    {"alpaca_jsonl", "a.jsonl"},
                           {"alpaca_csv", "a.csv"},      {"sharegpt", "s.jsonl"},
                           {"sharegpt_tags", "t.jsonl"}, {"openai", "o.json"}};

// One directory per process, with a dataset_info.json that names every kind.
fs::path processDir() {
  return fs::temp_directory_path() / ("tandem_dataset_fuzz_" + std::to_string(getpid()));
}

const fs::path& datasetDir() {
  static const fs::path dir = [] {
    const fs::path d = processDir();
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(processDir(), ec);
    });
    std::ofstream(d / "dataset_info.json") << R"({
      "alpaca_json": {"file_name": "a.json"},
      "alpaca_jsonl": {"file_name": "a.jsonl", "columns": {"prompt": "instruction",
                       "query": "input", "response": "output", "system": "system",
                       "history": "history"}},
      "alpaca_csv": {"file_name": "a.csv"},
      "sharegpt": {"file_name": "s.jsonl", "formatting": "sharegpt",
                   "columns": {"messages": "conversations", "system": "system", "tools": "tools"}},
      "sharegpt_tags": {"file_name": "t.jsonl", "formatting": "sharegpt",
                        "columns": {"messages": "messages"},
                        "tags": {"role_tag": "role", "content_tag": "content",
                                 "user_tag": "user", "assistant_tag": "assistant",
                                 "observation_tag": "tool", "function_tag": "function_call",
                                 "system_tag": "system"}},
      "openai": {"file_name": "o.json", "formatting": "openai"}
    })";
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Kind& kind = kKinds[data[0] % (sizeof(kKinds) / sizeof(kKinds[0]))];
  const fs::path& dir = datasetDir();
  std::ofstream(dir / kind.file, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  try {
    tandem::train::DatasetReport report;
    const auto conversations = tandem::train::loadDatasets(dir, {kind.name}, std::nullopt, report);
    if (conversations.empty() || static_cast<int64_t>(conversations.size()) != report.totalKept())
      __builtin_trap();
  } catch (const tandem::Error&) {
    // No usable row, or a file that is not JSON/CSV: expected for most inputs.
  }
  return 0;
}
