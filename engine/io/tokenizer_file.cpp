// Tokenizer::load: a tokenizer.json file, the model directory holding one, or a GGUF file's
// tokenizer metadata. Apart from tokenizer_load.cpp so that reading from text needs no GGUF reader.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"
#include "engine/io/gguf_model.h"
#include "engine/io/tokenizer.h"

namespace tandem::io {
namespace {

std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error("cannot read " + path.string(), "check that the file exists and is readable");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  if (isGgufPath(path)) {
    const std::unique_ptr<GgufModel> gguf = GgufModel::open(path);
    return fromJson(gguf->tokenizerJson(), gguf->tokenizerConfigJson(),
                    gguf->path().string() + " (its tokenizer)");
  }
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path)) file = path / "tokenizer.json";
  if (!std::filesystem::exists(file)) {
    const bool sp = std::filesystem::exists(file.parent_path() / "tokenizer.model");
    throw Error(
        "no tokenizer.json at " + file.string(),
        sp ? "only tokenizer.model (SentencePiece) is there; convert it with transformers "
             "(AutoTokenizer.from_pretrained(dir).save_pretrained(dir)) to get tokenizer.json"
           : "pass a tokenizer.json file or the model directory that holds one");
  }
  const std::filesystem::path config = file.parent_path() / "tokenizer_config.json";
  const std::string config_text =
      std::filesystem::exists(config) ? readFile(config) : std::string();
  return fromJson(readFile(file), config_text, file.string());
}

}  // namespace tandem::io
