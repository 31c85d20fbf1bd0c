#pragma once
// The server's ChatBackend over the generation API (generator.h): one base model with named
// LoRA adapters, unmerged and switched per request. Messages are rendered with the generator's
// chat template; the generator streams UTF-8-complete text and cuts stop strings.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/infer/generator.h"
#include "engine/serve/openai_server.h"

namespace tandem::serve {

struct ModelChatBackendOptions {
  std::filesystem::path model_dir;
  std::vector<std::pair<std::string, std::filesystem::path>> adapters;  // model id -> adapter dir
  infer::GeneratorOptions generator;  // placement (the planner's by default), dtype, template
  int64_t max_tokens_limit = 4096;    // default and cap of max_tokens
};

class ModelChatBackend : public ChatBackend {
 public:
  // Loads the model and the adapters. Throws tandem::Error on anything unusable (missing files,
  // an adapter for another model, an unknown template, a reserved or repeated name).
  explicit ModelChatBackend(const ModelChatBackendOptions& options);

  std::vector<std::string> modelIds() const override;
  const infer::Generator& generator() const { return *generator_; }
  PreparedChat prepare(const openai::ChatRequest& request) const override;
  ChatResult generate(const PreparedChat& chat, const TextSink& on_text,
                      std::stop_token stop) override;

 private:
  std::unique_ptr<infer::Generator> generator_;
  int64_t max_tokens_limit_ = 0;
  // Fixed after loading; kept here so /v1/models and prepare() never wait for a generation.
  std::vector<std::string> ids_;
  int64_t context_tokens_ = 0;
};

}  // namespace tandem::serve
