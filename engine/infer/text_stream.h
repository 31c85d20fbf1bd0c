#pragma once
// Turns a growing list of generated token ids into text that is safe to send piece by piece:
//   - byte-level tokens can end inside a UTF-8 character; such a tail decodes to U+FFFD and is
//     held back until the next token completes it (or the stream ends);
//   - stop strings (OpenAI `stop`) may be split across tokens; text that could be the start of
//     one is held back, and when one appears the answer ends just before it.
// The text is re-decoded from all ids each step (tokenizers' decode is not concatenative: a
// SentencePiece leading space or a byte sequence depends on the neighbours), so what is emitted
// always equals a prefix of decode(all ids).

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace tandem::infer {

class TextStream {
 public:
  using Decode = std::function<std::string(std::span<const int32_t> ids)>;

  TextStream(Decode decode, std::vector<std::string> stop_strings)
      : decode_(std::move(decode)), stop_strings_(std::move(stop_strings)) {}

  // Adds one generated id; returns the newly final text (possibly empty). After a stop string
  // was seen, stopped() is true and further ids are ignored.
  std::string push(int32_t id);
  // The end of generation: returns whatever was held back (an incomplete UTF-8 tail as decode
  // gives it, or a partial stop string that never completed).
  std::string finish();

  bool stopped() const { return stopped_; }
  const std::string& emitted() const { return emitted_; }  // everything returned so far

 private:
  std::string release(const std::string& text, bool at_end);

  Decode decode_;
  std::vector<std::string> stop_strings_;
  std::vector<int32_t> ids_;
  std::string emitted_;
  bool stopped_ = false;
};

}  // namespace tandem::infer
