#include "engine/infer/text_stream.h"

#include <algorithm>
#include <string_view>

namespace tandem::infer {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD, what decode gives for a cut sequence

// Length of the longest suffix of `text` that is a proper prefix of some stop string.
size_t partialStopLength(std::string_view text, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const std::string& stop : stops) {
    for (size_t n = std::min(text.size(), stop.size() - 1); n > longest; --n) {
      if (text.substr(text.size() - n) == std::string_view(stop).substr(0, n)) {
        longest = n;
        break;
      }
    }
  }
  return longest;
}

}  // namespace

std::string TextStream::push(int32_t id) {
  if (stopped_) return {};
  ids_.push_back(id);
  return release(decode_(ids_), /*at_end=*/false);
}

std::string TextStream::finish() {
  if (stopped_ || ids_.empty()) return {};
  return release(decode_(ids_), /*at_end=*/true);
}

std::string TextStream::release(const std::string& text, bool at_end) {
  // Everything already emitted is a prefix of `text` (see the header), and no stop string can
  // start inside it: any suffix of it that begins one was held back. So search the rest only.
  std::string_view fresh(text);
  fresh.remove_prefix(std::min(emitted_.size(), text.size()));
  size_t cut = std::string_view::npos;
  for (const std::string& stop : stop_strings_) {
    const size_t at = fresh.find(stop);
    if (at != std::string_view::npos) cut = std::min(cut, at);
  }
  if (cut != std::string_view::npos) {
    stopped_ = true;
    std::string out(fresh.substr(0, cut));
    emitted_ += out;
    return out;
  }
  size_t hold = 0;
  if (!at_end) {
    if (fresh.size() >= kReplacement.size() && fresh.substr(fresh.size() - kReplacement.size()) == kReplacement) {
      hold = kReplacement.size();
    }
    hold = std::max(hold, partialStopLength(fresh, stop_strings_));
  }
  std::string out(fresh.substr(0, fresh.size() - std::min(hold, fresh.size())));
  emitted_ += out;
  return out;
}

}  // namespace tandem::infer
