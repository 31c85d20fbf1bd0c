// readModelConfig: config.json from a model directory or file, or a GGUF file's metadata. Apart
// from model_config.cpp so that parsing config.json text needs no GGUF reader.
#include <fstream>
#include <sstream>

#include "engine/core/error.h"
#include "engine/io/gguf_model.h"
#include "engine/io/model_config.h"

namespace tandem::io {

ModelConfig readModelConfig(const std::filesystem::path& path) {
  if (isGgufPath(path)) {
    const std::unique_ptr<GgufModel> gguf = GgufModel::open(path);
    ModelConfig config = parseModelConfig(gguf->configJson(),
                                          gguf->path().string() + " (its metadata as config.json)");
    config.source = gguf->path();
    return config;
  }
  std::error_code ec;
  std::filesystem::path file =
      std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw Error("cannot read " + file.string() + ": " +
                    (std::filesystem::exists(file, ec) ? "permission denied or not a file"
                                                       : "no such file"),
                "pass a Hugging Face model directory that contains config.json");
  }
  std::ostringstream text;
  text << in.rdbuf();
  ModelConfig config = parseModelConfig(text.str(), file.string());
  config.source = file;
  return config;
}

}  // namespace tandem::io
