#pragma once
// The server's ChatBackend over the engine: one base model with named LoRA adapters, its
// tokenizer and a chat template (LLaMA-Factory's, by name). It renders OpenAI messages with the
// template, generates through the generation API, and streams the text with stop strings cut.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/infer/openai_server.h"

namespace tandem::infer {

struct ModelChatBackendOptions {
  std::filesystem::path model_dir;
  std::vector<std::pair<std::string, std::filesystem::path>> adapters;  // model id -> PEFT adapter dir
  std::string template_name;  // LLaMA-Factory template (qwen3, llama3, ...)
  std::string dtype = "fp32";  // fp32 or bf16
  std::string device = "cpu";  // cpu or cuda:N, for the dense parts
  int64_t max_tokens_limit = 4096;  // default and cap of max_tokens
};

class ModelChatBackend : public ChatBackend {
 public:
  // Loads the model, the adapters and the tokenizer. Throws tandem::Error on anything unusable
  // (missing files, an adapter for another model, an unknown template, a reserved name).
  explicit ModelChatBackend(const ModelChatBackendOptions& options);
  ~ModelChatBackend() override;

  std::vector<std::string> modelIds() const override;
  PreparedChat prepare(const openai::ChatRequest& request) const override;
  ChatResult generate(const PreparedChat& chat, const TextSink& on_text, std::stop_token stop) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::infer
