#pragma once
// Turns generated token ids into streamed text deltas. Text is only released when it is final:
// an incomplete UTF-8 sequence at the end (decoded as U+FFFD) and any tail that could still grow
// into a stop string are held back, so a client never sees half a character or part of a stop
// string. Stop tokens (eos, the template's stop words) are reported as ids but never as text.
// No libtorch here.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/infer/generator.h"

namespace tandem::io {
class Tokenizer;
}

namespace tandem::infer {

class TextStream {
 public:
  // stop_strings: non-empty strings; the text ends before the first one that appears.
  TextStream(const io::Tokenizer& tokenizer, std::vector<std::string> stop_strings,
             std::vector<int32_t> stop_ids, DeltaCallback on_delta);

  // Adds one generated id; returns false when a stop string is complete (the text is cut
  // before it and the delta up to it is out).
  bool push(int32_t id);
  // Releases what was held back (nothing after a stop string).
  void finish();

  const std::string& text() const { return stopped_ ? final_text_ : text_; }
  bool stoppedByString() const { return stopped_; }

 private:
  void emit(size_t end);
  size_t heldBack() const;  // bytes at the end of text_ that may not be released yet

  const io::Tokenizer& tokenizer_;
  std::vector<std::string> stop_strings_;
  std::vector<int32_t> stop_ids_;
  DeltaCallback on_delta_;
  std::vector<int32_t> text_ids_;     // ids that make up the text (no stop tokens)
  std::vector<int32_t> pending_ids_;  // ids not yet reported in a delta
  std::string text_;
  std::string final_text_;
  size_t emitted_ = 0;  // bytes of text_ already released
  bool stopped_ = false;
};

}  // namespace tandem::infer
