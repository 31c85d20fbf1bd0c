#include "engine/infer/text_stream.h"

#include <algorithm>
#include <string_view>

#include "engine/io/tokenizer.h"

namespace tandem::infer {

namespace {
constexpr std::string_view kReplacement =
    "\xEF\xBF\xBD";  // U+FFFD: bytes of an unfinished character
}

TextStream::TextStream(const io::Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                       std::vector<int32_t> stop_ids, DeltaCallback on_delta)
    : tokenizer_(tokenizer), stop_ids_(std::move(stop_ids)), on_delta_(std::move(on_delta)) {
  for (std::string& s : stop_strings) {
    if (!s.empty()) stop_strings_.push_back(std::move(s));
  }
}

size_t TextStream::heldBack() const {
  const std::string_view open(text_.data() + emitted_, text_.size() - emitted_);
  size_t hold = 0;
  // A trailing replacement character may be the start of a multi-byte character.
  if (open.ends_with(kReplacement)) hold = kReplacement.size();
  const std::string_view body = open.substr(0, open.size() - hold);
  size_t longest = 0;
  for (const std::string& stop : stop_strings_) {
    for (size_t k = std::min(stop.size() - 1, body.size()); k > longest; --k) {
      if (body.ends_with(std::string_view(stop).substr(0, k))) {
        longest = k;
        break;
      }
    }
  }
  return hold + longest;
}

void TextStream::emit(size_t end) {
  if (end <= emitted_ && pending_ids_.empty()) return;
  const std::string_view delta = end > emitted_
                                     ? std::string_view(text_).substr(emitted_, end - emitted_)
                                     : std::string_view();
  if (on_delta_) on_delta_(GenerationDelta{delta, pending_ids_});
  emitted_ = std::max(emitted_, end);
  pending_ids_.clear();
}

bool TextStream::push(int32_t id) {
  if (stopped_) return false;
  pending_ids_.push_back(id);
  if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) return true;
  text_ids_.push_back(id);
  text_ = tokenizer_.decode(text_ids_, /*skip_special_tokens=*/true);
  // Released text never holds a whole stop string, so one can only start at emitted_ or later.
  size_t cut = std::string::npos;
  for (const std::string& stop : stop_strings_) {
    const size_t at = text_.find(stop, emitted_ >= stop.size() ? emitted_ - stop.size() + 1 : 0);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    emit(std::max(cut, emitted_));
    final_text_ = text_.substr(0, std::max(cut, emitted_));
    stopped_ = true;
    return false;
  }
  const size_t hold = heldBack();
  if (text_.size() - hold > emitted_) emit(text_.size() - hold);
  return true;
}

void TextStream::finish() {
  if (stopped_) {
    emit(emitted_);
    return;
  }
  emit(text_.size());
}

}  // namespace tandem::infer
