#include "engine/chat/tokenizer_encoder.h"

#include "engine/core/error.h"

namespace tandem::chat {

TokenizerEncoder::TokenizerEncoder(const io::Tokenizer& tokenizer,
                                   const ChatTemplate& chat_template)
    : tokenizer_(tokenizer) {
  std::optional<int32_t> eos = tokenizer.eosId();
  if (chat_template.replaceEos() && !chat_template.stopWords().empty()) {
    eos = tokenizer.tokenToId(chat_template.stopWords().front());
  }
  if (!eos) {
    throw Error("the tokenizer has no end-of-sequence token for template " + chat_template.name(),
                "set eos_token in the model's tokenizer_config.json");
  }
  eos_ = *eos;
}

}  // namespace tandem::chat
