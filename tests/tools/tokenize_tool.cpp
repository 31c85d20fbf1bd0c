// tokenize_tool TOKENIZER IN.jsonl OUT.jsonl: encodes every line of IN with tandem::io::Tokenizer
// and writes one line per input to OUT. An input line is a JSON string, or an object
// {"text": "...", "add_special_tokens": true}. An output line is
// {"ids": [...], "decoded": decode(ids), "decoded_skip": decode(ids, skip_special_tokens=true)},
// or {"error": "..."} when that input fails. The parity test tests/parity/test_tokenizer_parity.py
// compares it with the PyPI `tokenizers` package.

#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/error.h"
#include "engine/io/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: tokenize_tool TOKENIZER_JSON_OR_DIR IN.jsonl OUT.jsonl\n";
    return 2;
  }
  try {
    const tandem::io::Tokenizer tokenizer = tandem::io::Tokenizer::load(argv[1]);
    std::ifstream in(argv[2]);
    std::ofstream out(argv[3]);
    if (!in || !out) {
      std::cerr << "cannot open " << argv[2] << " or " << argv[3] << "\n";
      return 2;
    }
    std::string line;
    double encode_s = 0;
    size_t bytes = 0;
    while (std::getline(in, line)) {
      const nlohmann::json item = nlohmann::json::parse(line);
      const std::string text =
          item.is_string() ? item.get<std::string>() : item.at("text").get<std::string>();
      const bool special = item.is_object() && item.value("add_special_tokens", false);
      nlohmann::json result;
      try {
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<int32_t> ids = tokenizer.encode(text, special);
        encode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        bytes += text.size();
        result["ids"] = ids;
        result["decoded"] = tokenizer.decode(ids);
        result["decoded_skip"] = tokenizer.decode(ids, true);
      } catch (const tandem::Error& e) {
        result = {{"error", e.message()}};
      }
      out << result.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    std::cerr << "encoded " << bytes << " bytes in " << encode_s << " s\n";
  } catch (const tandem::Error& e) {
    std::cerr << "error: " << e.message() << "\n" << e.whatToDo() << "\n";
    return 1;
  }
  return 0;
}
