#pragma once
// Internal to the GGUF model view (gguf_model.cpp): the pieces that turn llama.cpp's metadata into
// Hugging Face's files. Each throws tandem::Error naming the file and the key.

#include <nlohmann/json.hpp>
#include <string>

#include "engine/io/gguf.h"

namespace tandem::io::gguf_detail {

// The HF model_type a GGUF architecture (and its metadata) stands for: "llama" with experts is
// mixtral, "deepseek2" with sigmoid gating is deepseek_v3. Error for anything else, listing what
// is read.
std::string hfModelType(const GgufFile& file);

// config.json as transformers 5 writes it for that model_type, from the `ARCH.*` keys.
// `embedding_rows`: token_embd's rows (the vocab size the weights have); `tied`: no output.weight.
nlohmann::json hfConfig(const GgufFile& file, const std::string& model_type, int64_t embedding_rows,
                        bool tied);

// tokenizer.json and tokenizer_config.json from `tokenizer.ggml.*` and `tokenizer.chat_template`.
struct HfTokenizerFiles {
  nlohmann::json tokenizer;
  nlohmann::json tokenizer_config;
};
HfTokenizerFiles hfTokenizer(const GgufFile& file);

}  // namespace tandem::io::gguf_detail
