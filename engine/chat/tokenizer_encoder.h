#pragma once
// The tokenizer as the supervised encoder and generation see it. With a template that replaces
// eos (LLaMA-Factory's replace_eos: qwen, llama3, ...), the template's first stop word is the
// end-of-turn token, both for training labels and as the stop token when generating.

#include "engine/chat/chat_template.h"
#include "engine/chat/supervised_encoder.h"
#include "engine/io/tokenizer.h"

namespace tandem::chat {

class TokenizerEncoder : public TextEncoder {
 public:
  // Throws Error when neither the template nor the tokenizer names an end token.
  TokenizerEncoder(const io::Tokenizer& tokenizer, const ChatTemplate& chat_template);
  std::vector<int32_t> encode(std::string_view text) const override {
    return tokenizer_.encode(text);
  }
  int32_t eosId() const override { return eos_; }
  std::optional<int32_t> bosId() const override { return tokenizer_.bosId(); }

 private:
  const io::Tokenizer& tokenizer_;
  int32_t eos_ = 0;
};

}  // namespace tandem::chat
