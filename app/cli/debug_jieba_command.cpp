// `tandem debug jieba FILE`: segments text with Tandem's port of jieba, for checking it against
// python jieba (tests/eval). FILE holds one JSON string per line; each output line is the JSON
// array list(jieba.cut(text)) gives.

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "app/cli/commands.h"
#include "engine/core/error.h"
#include "engine/core/install_layout.h"
#include "engine/eval/jieba_segmenter.h"
#include "engine/io/bounded_json.h"

namespace tandem::cli {

namespace {

void cutLines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path, "pass a file with one JSON string per line");
  const eval::JiebaSegmenter& jieba = eval::JiebaSegmenter::shared(resourcesDir() / "jieba");
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::optional<nlohmann::json> text =
        io::tryParseBoundedJson(line, io::kDatasetJsonLimits);
    if (!text || !text->is_string()) {
      throw Error(path + " line " + std::to_string(line_no) + " is not a JSON string",
                  "write each text as a JSON string on its own line");
    }
    const std::string words = nlohmann::json(jieba.cut(text->get<std::string>())).dump();
    std::printf("%s\n", words.c_str());
  }
}

}  // namespace

void addDebugJiebaCommand(CLI::App& app) {
  CLI::App* debug = app.get_subcommand("debug");
  auto* command = debug->add_subcommand(
      "jieba", "Cut text into words as jieba.cut does (one JSON string per line)");
  auto file = std::make_shared<std::string>();
  command->add_option("FILE", *file, "text file, one JSON string per line")->required();
  command->callback([file] { cutLines(*file); });
}

}  // namespace tandem::cli
