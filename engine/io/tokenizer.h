#pragma once
// Tokenizer: reads a Hugging Face tokenizer.json (plus tokenizer_config.json beside it) and encodes
// text to the ids the Rust `tokenizers` package (0.23) produces, for the BPE tokenizers of the
// supported model families: byte-level BPE (Qwen2/2.5/3, Qwen3-MoE, DeepSeek-V2/V3, Llama-3) and
// SentencePiece-style BPE with byte fallback (Llama-2, Mixtral). docs/tokenizer.md lists exactly
// which tokenizer.json components are understood; anything else fails at load() with a
// tandem::Error naming the component.
//
// Encoding runs the crate's pipeline: added tokens are cut out first (special ones and those with
// "normalized": false on the raw text, the others after normalization), each remaining segment is
// normalized and pre-tokenized, every word is BPE-merged (lowest merge rank first, leftmost on
// ties), and add_special_tokens applies the post-processor (e.g. Llama-3's <|begin_of_text|>).
//
// A Tokenizer is immutable after load() and safe to use from many threads; copies share state.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::io {

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a model directory holding one. tokenizer_config.json next to
  // it, when present, gives eos/bos/pad tokens and add_bos_token / add_eos_token. A GGUF model
  // (isGgufPath) gives both from its tokenizer.ggml.* metadata (GgufModel).
  // Throws tandem::Error: missing file, invalid JSON, unsupported model type or component, bad
  // regex.
  static Tokenizer load(const std::filesystem::path& path);
  // The same from the JSON texts (config_json may be empty). `label` names the source in errors.
  static Tokenizer fromJson(std::string_view tokenizer_json, std::string_view config_json = {},
                            std::string_view label = "tokenizer.json");

  // Text must be valid UTF-8 (tandem::Error otherwise). add_special_tokens applies the
  // post-processor's template (BOS/EOS), as `tokenizers`' encode(..., add_special_tokens=True).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids back to text, as `tokenizers`' decode (byte-level bytes that do not form UTF-8 become
  // U+FFFD). Throws tandem::Error on an id outside [0, vocabSize()).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> tokenToId(std::string_view token) const;  // vocab or added token
  std::string idToToken(int32_t id) const;  // the vocab spelling ("Ġhello"); throws if unknown
  // One past the largest id of the vocab and the added tokens (the embedding rows needed).
  int64_t vocabSize() const;
  bool isSpecial(int32_t id) const;  // an added token with "special": true

  // From tokenizer_config.json ("eos_token" etc., a string or {"content": ...}); nullopt when the
  // file or the entry is absent or null.
  std::optional<int32_t> eosId() const;
  std::optional<int32_t> bosId() const;
  std::optional<int32_t> padId() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tandem::io
