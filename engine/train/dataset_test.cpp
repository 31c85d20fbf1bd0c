#include "engine/train/dataset.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "engine/core/error.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;

class DatasetTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem_dataset_test_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
    write("dataset_info.json", R"({
      "alpaca_demo": {"file_name": "alpaca.json"},
      "custom_alpaca": {"file_name": "custom.jsonl",
                        "columns": {"prompt": "q", "query": "ctx", "response": "a",
                                    "system": "sys", "history": "hist"}},
      "sharegpt_demo": {"file_name": "sharegpt.json", "formatting": "sharegpt",
                        "columns": {"messages": "conversations", "system": "system"}},
      "openai_demo": {"file_name": "openai.jsonl", "formatting": "sharegpt",
                      "columns": {"messages": "messages"},
                      "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                               "assistant_tag": "assistant", "system_tag": "system"}},
      "openai_short": {"file_name": "openai.jsonl", "formatting": "openai"},
      "csv_demo": {"file_name": "data.csv"},
      "bad_rows": {"file_name": "bad.jsonl", "columns": {"system": "system"}},
      "bad_chats": {"file_name": "bad_chats.jsonl", "formatting": "sharegpt"},
      "all_bad": {"file_name": "all_bad.json"},
      "broken_json": {"file_name": "broken.json"},
      "missing_file": {"file_name": "nope.json"}
    })");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::vector<chat::Conversation> load(const std::vector<std::string>& names,
                                       std::optional<int64_t> max_samples = std::nullopt) {
    report_ = {};
    return loadDatasets(dir_, names, max_samples, report_);
  }
  std::string errorOf(const std::vector<std::string>& names) {
    try {
      load(names);
    } catch (const Error& e) {
      return e.message() + " | " + e.whatToDo();
    }
    return "(no error)";
  }

  fs::path dir_;
  DatasetReport report_;
};

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

TEST_F(DatasetTest, Alpaca) {
  write("alpaca.json", R"([
  {"instruction": "Add", "input": "1 2", "output": "3"},
  {"instruction": "Greet", "input": "", "output": "Hi", "system": "Be nice"},
  {"instruction": "", "input": "only input", "output": "ok"}
])");
  auto convs = load({"alpaca_demo"});
  ASSERT_EQ(convs.size(), 3u);
  EXPECT_EQ(convs[0].messages[0].content, "Add\n1 2");  // instruction + "\n" + input
  EXPECT_EQ(convs[0].messages[0].role, chat::Role::User);
  EXPECT_EQ(convs[0].messages[1].content, "3");
  EXPECT_EQ(convs[0].messages[1].role, chat::Role::Assistant);
  EXPECT_EQ(convs[1].messages[0].content, "Greet");
  EXPECT_EQ(convs[1].system, "");  // as in LLaMA-Factory: no "system" column mapped, none read
  EXPECT_EQ(convs[2].messages[0].content, "only input");
  EXPECT_EQ(convs[0].source.line, 2);
  EXPECT_EQ(convs[2].source.line, 4);
  EXPECT_EQ(convs[2].source.index, 2);
  EXPECT_EQ(report_.totalKept(), 3);
}

// A row nested 100k deep (a hostile "tools" value) is that row's error, with its line; the
// rest of the file trains. Without the bound it overflowed the stack when copied or dumped.
TEST_F(DatasetTest, ARowNestedPastTheLimitIsABadRowNotACrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  write("alpaca.json",
        "[\n{\"instruction\": \"a\", \"output\": \"b\"},\n"
        "{\"instruction\": \"x\", \"output\": \"y\", \"tools\": " +
            deep + "},\n{\"instruction\": \"c\", \"output\": \"d\"}\n]");
  auto convs = load({"alpaca_demo"});
  ASSERT_EQ(convs.size(), 2u);
  EXPECT_EQ(convs[1].messages[0].content, "c");
  EXPECT_EQ(convs[1].source.line, 4);
  ASSERT_EQ(report_.totalSkipped(), 1);
  const RowProblem& problem = report_.datasets[0].first_problems.at(0);
  EXPECT_EQ(problem.line, 3);
  EXPECT_TRUE(contains(problem.reason, "nested deeper than 64")) << problem.reason;
  // The same row in JSON lines.
  write("bad_chats.jsonl",
        "{\"conversations\": [{\"from\": \"human\", \"value\": \"Q\"}, {\"from\": \"gpt\", "
        "\"value\": \"A\"}], \"tools\": " +
            deep +
            "}\n{\"conversations\": [{\"from\": \"human\", \"value\": \"Q\"}, "
            "{\"from\": \"gpt\", \"value\": \"A\"}]}\n");
  EXPECT_EQ(load({"bad_chats"}).size(), 1u);
  EXPECT_EQ(report_.totalSkipped(), 1);
  EXPECT_EQ(report_.datasets[0].first_problems.at(0).line, 1);
}

TEST_F(DatasetTest, AlpacaCustomColumnsAndHistory) {
  write("custom.jsonl",
        R"({"q": "Q3", "ctx": "C", "a": "A3", "sys": "S", "hist": [["Q1", "A1"], ["Q2", "A2"]]})"
        "\n");
  auto convs = load({"custom_alpaca"});
  ASSERT_EQ(convs.size(), 1u);
  const auto& m = convs[0].messages;
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0].content, "Q1");
  EXPECT_EQ(m[1].content, "A1");
  EXPECT_EQ(m[3].content, "A2");
  EXPECT_EQ(m[4].content, "Q3\nC");
  EXPECT_EQ(m[5].content, "A3");
  EXPECT_EQ(convs[0].system, "S");
}

TEST_F(DatasetTest, Sharegpt) {
  write("sharegpt.json", R"([{"conversations": [
    {"from": "system", "value": "Sys"},
    {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"},
    {"from": "observation", "value": "{\"t\": 1}"}, {"from": "gpt", "value": "Done"}]},
  {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}], "system": "col"}])");
  auto convs = load({"sharegpt_demo"});
  ASSERT_EQ(convs.size(), 2u);
  EXPECT_EQ(convs[0].system, "Sys");
  ASSERT_EQ(convs[0].messages.size(), 4u);
  EXPECT_EQ(convs[0].messages[2].role, chat::Role::Observation);
  EXPECT_EQ(convs[0].messages[3].content, "Done");
  EXPECT_EQ(convs[1].system, "col");
}

TEST_F(DatasetTest, OpenAiVariantBothSpellings) {
  write(
      "openai.jsonl",
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})"
      "\n\n"
      R"({"messages": [{"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}]})"
      "\n");
  for (const char* name : {"openai_demo", "openai_short"}) {
    SCOPED_TRACE(name);
    auto convs = load({name});
    ASSERT_EQ(convs.size(), 2u);
    EXPECT_EQ(convs[0].system, "S");
    EXPECT_EQ(convs[0].messages.size(), 2u);
    EXPECT_EQ(convs[1].messages[0].content, "Q2");
    EXPECT_EQ(convs[1].source.line, 3);  // the blank line is skipped but counted
  }
}

TEST_F(DatasetTest, CsvWithQuotesCommasAndNewlines) {
  write("data.csv",
        "instruction,input,output\r\n"
        "plain,,one\r\n"
        "\"has, comma\",\"say \"\"hi\"\"\",\"two\nlines\"\r\n"
        "last,x,three");
  auto convs = load({"csv_demo"});
  ASSERT_EQ(convs.size(), 3u);
  EXPECT_EQ(convs[0].messages[0].content, "plain");
  EXPECT_EQ(convs[1].messages[0].content, "has, comma\nsay \"hi\"");
  EXPECT_EQ(convs[1].messages[1].content, "two\nlines");
  EXPECT_EQ(convs[2].messages[0].content, "last\nx");
  EXPECT_EQ(convs[1].source.line, 3);
  EXPECT_EQ(convs[2].source.line, 5);  // the quoted newline moved it down a line
}

TEST(CsvTest, Rfc4180) {
  auto rows = parseCsv(
      "\xEF\xBB\xBF"
      "a,b,c\n1,\"\",3\n\"x\r\ny\",\"\"\"\",\n\n",
      "t.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].fields, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(rows[1].fields, (std::vector<std::string>{"1", "", "3"}));
  EXPECT_EQ(rows[2].fields, (std::vector<std::string>{"x\r\ny", "\"", ""}));
  EXPECT_EQ(rows[2].line, 3);
  EXPECT_EQ(parseCsv("", "t.csv").size(), 0u);
  EXPECT_EQ(parseCsv("a,b", "t.csv")[0].fields.size(), 2u);  // no trailing newline
}

TEST(CsvTest, MalformedQuotesAreErrorsWithLines) {
  try {
    parseCsv("a,b\n1,\"open\n\n", "t.csv");
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.message(), "t.csv:2")) << e.message();
  }
  try {
    parseCsv("a,b\n\"x\"y,2\n", "t.csv");
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.message(), "t.csv:2")) << e.message();
  }
}

TEST_F(DatasetTest, BadAlpacaRowsAreSkippedAndReported) {
  struct Row {
    const char* json;
    const char* reason;
  };  // reason: "" = valid
  const Row rows[] = {
      {R"({"instruction": "ok", "output": "fine"})", ""},
      {R"([1, 2])", "not a JSON object"},
      {R"({"output": "no instruction"})", "missing \"instruction\""},
      {R"({"instruction": "no output"})", "missing \"output\""},
      {R"({"instruction": "x", "output": 5})", "\"output\" is not a string"},
      {R"({"instruction": 7, "output": "x"})", "\"instruction\" is not a string"},
      {R"({"instruction": "", "input": "", "output": "x"})", "both empty"},
      {R"({"instruction": "x", "output": "y", "system": ["s"]})", "\"system\" is not a string"},
      {R"({"instruction": "ok too", "output": "fine"})", ""},
  };
  std::string text;
  for (const Row& r : rows) text += std::string(r.json) + "\n";
  write("bad.jsonl", text);
  auto convs = load({"bad_rows"});
  EXPECT_EQ(convs.size(), 2u);
  ASSERT_EQ(report_.datasets.size(), 1u);
  const DatasetFileReport& rep = report_.datasets[0];
  EXPECT_EQ(rep.rows_read, 9);
  EXPECT_EQ(rep.rows_skipped, 7);
  ASSERT_EQ(rep.first_problems.size(), DatasetReport::kMaxReportedProblems);
  int64_t k = 0;
  for (int64_t line = 1; line <= 9 && k < 5; ++line) {
    if (*rows[line - 1].reason == 0) continue;
    EXPECT_EQ(rep.first_problems[k].line, line);
    EXPECT_TRUE(contains(rep.first_problems[k].reason, rows[line - 1].reason))
        << rep.first_problems[k].reason;
    ++k;
  }
  EXPECT_TRUE(contains(report_.summary(), "line 2: not a JSON object")) << report_.summary();
}

TEST_F(DatasetTest, BadConversationsAreSkippedAndReported) {
  struct Row {
    const char* json;
    const char* reason;
  };
  const Row rows[] = {
      {R"({"conversations": []})", "empty conversation"},
      {R"({"conversations": [{"from": "human", "value": "Q"}]})",
       "last message is not an assistant turn"},
      {R"({"conversations": [{"from": "gpt", "value": "A"}, {"from": "human", "value": "Q"}]})",
       "message 1: expected 'human' or 'observation', got 'gpt'"},
      {R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "human", "value": "Q"}]})",
       "message 2: expected 'gpt' or 'function_call'"},
      {R"({"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "A"}]})",
       "message 1: no string \"value\""},
      {R"({"conversations": "text"})", "\"conversations\" is not a list"},
      {R"({"conversations": [{"from": "system", "value": "S"}]})", "only a system message"},
      {R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]})",
       ""},
  };
  std::string text;
  for (const Row& r : rows) text += std::string(r.json) + "\n";
  write("bad_chats.jsonl", text);
  auto convs = load({"bad_chats"});
  EXPECT_EQ(convs.size(), 1u);
  const DatasetFileReport& rep = report_.datasets[0];
  EXPECT_EQ(rep.rows_skipped, 7);
  ASSERT_EQ(rep.first_problems.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(rep.first_problems[i].line, static_cast<int64_t>(i + 1));
    EXPECT_TRUE(contains(rep.first_problems[i].reason, rows[i].reason))
        << rep.first_problems[i].reason;
  }
}

TEST_F(DatasetTest, ZeroValidRowsIsAnErrorNamingFileAndReasons) {
  write("all_bad.json", R"([{"instruction": "x"}, {"input": "y", "output": "z"}])");
  std::string err = errorOf({"all_bad"});
  EXPECT_TRUE(contains(err, "all_bad.json")) << err;
  EXPECT_TRUE(contains(err, "no usable rows")) << err;
  EXPECT_TRUE(contains(err, "line 1: missing \"output\"")) << err;
}

TEST_F(DatasetTest, UnknownNameListsKnownNames) {
  std::string err = errorOf({"alpaca_dmeo"});
  EXPECT_TRUE(contains(err, "unknown dataset 'alpaca_dmeo'")) << err;
  EXPECT_TRUE(contains(err, "alpaca_demo, ")) << err;
  EXPECT_TRUE(contains(err, "sharegpt_demo")) << err;
}

TEST_F(DatasetTest, MissingFileAndInvalidJson) {
  EXPECT_TRUE(contains(errorOf({"missing_file"}), "not found")) << errorOf({"missing_file"});
  write("broken.json",
        "[\n  {\"instruction\": \"a\", \"output\": \"b\"},\n  {\"instruction\": oops}\n]");
  std::string err = errorOf({"broken_json"});
  EXPECT_TRUE(contains(err, "broken.json:3: invalid JSON")) << err;
  write("broken.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \n");
  err = errorOf({"broken.jsonl"});
  EXPECT_TRUE(contains(err, "broken.jsonl:2: invalid JSON")) << err;
}

TEST_F(DatasetTest, MultipleDatasetsMaxSamplesAndPlainFiles) {
  write("alpaca.json",
        R"([{"instruction": "a1", "output": "x"}, {"instruction": "a2", "output": "x"},
                           {"instruction": "a3", "output": "x"}])");
  write("plain.jsonl",
        "{\"conversations\": [{\"from\": \"human\", \"value\": \"p1\"}, {\"from\": \"gpt\", "
        "\"value\": \"x\"}]}\n"
        "{\"conversations\": [{\"from\": \"human\", \"value\": \"p2\"}, {\"from\": \"gpt\", "
        "\"value\": \"x\"}]}\n");
  auto convs = load(splitDatasetNames("alpaca_demo, plain.jsonl"), 2);
  ASSERT_EQ(convs.size(), 4u);  // max_samples applies to each dataset
  EXPECT_EQ(convs[0].messages[0].content, "a1");
  EXPECT_EQ(convs[1].messages[0].content, "a2");
  EXPECT_EQ(convs[2].messages[0].content, "p1");  // a plain file, detected as sharegpt
  EXPECT_EQ(report_.datasets.size(), 2u);
  EXPECT_TRUE(contains(convs[3].source.file, "plain.jsonl"));
  // An absolute path works too.
  convs = load({(dir_ / "plain.jsonl").string()});
  EXPECT_EQ(convs.size(), 2u);
}

TEST(SplitDatasetNamesTest, TrimsAndDropsEmpty) {
  EXPECT_EQ(splitDatasetNames(" a, b ,,c"), (std::vector<std::string>{"a", "b", "c"}));
}

}  // namespace
}  // namespace tandem::train
