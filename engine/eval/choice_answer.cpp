#include "engine/eval/choice_answer.h"

namespace tandem::eval {

namespace {

bool isAsciiAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}
bool isAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

}  // namespace

std::optional<char> extractChoice(std::string_view text, std::string_view letters) {
  while (!text.empty() && isAsciiSpace(text.front())) text.remove_prefix(1);
  while (!text.empty() && isAsciiSpace(text.back())) text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  const auto is_choice = [&](char c) { return letters.find(c) != std::string_view::npos; };
  if (is_choice(text[0]) && (text.size() == 1 || !isAsciiAlnum(text[1]))) return text[0];
  for (size_t i = text.size(); i-- > 0;) {
    if (!is_choice(text[i])) continue;
    const bool alone_left = i == 0 || !isAsciiAlnum(text[i - 1]);
    const bool alone_right = i + 1 == text.size() || !isAsciiAlnum(text[i + 1]);
    if (alone_left && alone_right) return text[i];
  }
  return std::nullopt;
}

}  // namespace tandem::eval
