#pragma once
// jieba's finalseg: the B/M/E/S hidden Markov model that cuts runs of characters the dictionary
// does not cover into words (jieba/finalseg/__init__.py). Internal to jieba_segmenter.cpp.

#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/io/tokenizer_pretokenize.h"

namespace tandem::eval::jieba {

// Python's re.split(pattern, text) for a pattern that is one capturing group around the whole
// match: the text between matches (possibly empty) and the matches, in order.
struct SplitPiece {
  std::string_view text;
  bool matched = false;
};
std::vector<SplitPiece> splitByRegex(const io::tokenizer_detail::Regex& regex,
                                     std::string_view text);

// Python's text.split(separator): every field, empty ones included.
std::vector<std::string_view> splitOn(std::string_view text, char separator);

// States in the order of their letters, so that comparing indices breaks ties the way Python's
// max() over (probability, letter) tuples does.
enum State : int { kB = 0, kE = 1, kM = 2, kS = 3 };
constexpr int kStates = 4;
constexpr double kMinFloat = -3.14e100;  // finalseg's MIN_FLOAT for unseen events

struct HmmModel {
  std::array<double, kStates> start{kMinFloat, kMinFloat, kMinFloat, kMinFloat};
  std::array<std::array<double, kStates>, kStates> trans{};  // [from][to], kMinFloat if unseen
  std::array<std::unordered_map<char32_t, double>, kStates> emit;

  // Parses resources/jieba/hmm.txt (see generate.py); `label` names the file in errors.
  static HmmModel parse(std::string_view text, std::string_view label);
};

// finalseg.cut(text): han runs through the Viterbi path, other runs split into
// [a-zA-Z0-9]+(?:\.\d+)?%? pieces and what lies between them. Appends to `out`.
void cutUnknown(const HmmModel& model, std::u32string_view text, std::vector<std::u32string>& out);

}  // namespace tandem::eval::jieba
