#include "engine/eval/jieba_hmm.h"

#include <charconv>

#include "engine/core/error.h"
#include "engine/eval/python_semantics.h"

namespace tandem::eval::jieba {

namespace {

using io::tokenizer_detail::Regex;

// finalseg's PrevStatus: the states that may precede each state.
constexpr std::array<std::array<int, 2>, kStates> kPrevious = {{
    {kE, kS},  // B
    {kB, kM},  // E
    {kM, kB},  // M
    {kS, kE},  // S
}};

int stateIndex(std::string_view letter) {
  if (letter == "B") return kB;
  if (letter == "E") return kE;
  if (letter == "M") return kM;
  if (letter == "S") return kS;
  return -1;
}

double parseDouble(std::string_view text, std::string_view label, size_t line_no) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw Error(std::string(label) + " line " + std::to_string(line_no) + ": \"" +
                    std::string(text) + "\" is not a number",
                "regenerate the file with resources/jieba/generate.py");
  }
  return value;
}

// Viterbi over B/M/E/S (finalseg.viterbi): the state of every character.
std::vector<int> viterbi(const HmmModel& model, std::u32string_view obs) {
  const auto emit = [&](int state, char32_t c) {
    const auto it = model.emit[state].find(c);
    return it == model.emit[state].end() ? kMinFloat : it->second;
  };
  const size_t n = obs.size();
  std::vector<std::array<double, kStates>> score(n);
  std::vector<std::array<int, kStates>> from(n);
  for (int y = 0; y < kStates; ++y) score[0][y] = model.start[y] + emit(y, obs[0]);
  for (size_t t = 1; t < n; ++t) {
    for (int y = 0; y < kStates; ++y) {
      const double em = emit(y, obs[t]);
      double best = 0;
      int best_state = -1;
      for (const int y0 : kPrevious[y]) {
        // Same association as Python: (V[t-1][y0] + trans) + emit.
        const double p = score[t - 1][y0] + model.trans[y0][y] + em;
        if (best_state < 0 || p > best || (p == best && y0 > best_state)) {
          best = p;
          best_state = y0;
        }
      }
      score[t][y] = best;
      from[t][y] = best_state;
    }
  }
  // The last character ends a word: E or S, ties to S.
  int state = score[n - 1][kS] >= score[n - 1][kE] ? kS : kE;
  std::vector<int> path(n);
  for (size_t t = n; t-- > 0;) {
    path[t] = state;
    if (t > 0) state = from[t][state];
  }
  return path;
}

// finalseg.__cut: words from the state path.
void cutHan(const HmmModel& model, std::u32string_view text, std::vector<std::u32string>& out) {
  const std::vector<int> path = viterbi(model, text);
  size_t begin = 0, next = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (path[i] == kB) {
      begin = i;
    } else if (path[i] == kE) {
      out.emplace_back(text.substr(begin, i + 1 - begin));
      next = i + 1;
    } else if (path[i] == kS) {
      out.emplace_back(text.substr(i, 1));
      next = i + 1;
    }
  }
  if (next < text.size()) out.emplace_back(text.substr(next));
}

}  // namespace

std::vector<SplitPiece> splitByRegex(const Regex& regex, std::string_view text) {
  std::vector<SplitPiece> pieces;
  size_t last = 0;
  for (const auto& [begin, end] : regex.findAll(text)) {
    pieces.push_back({text.substr(last, begin - last), false});
    pieces.push_back({text.substr(begin, end - begin), true});
    last = end;
  }
  pieces.push_back({text.substr(last), false});
  return pieces;
}

std::vector<std::string_view> splitOn(std::string_view text, char separator) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    fields.push_back(
        text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return fields;
    start = end + 1;
  }
}

HmmModel HmmModel::parse(std::string_view text, std::string_view label) {
  HmmModel model;
  for (auto& row : model.trans) row.fill(kMinFloat);
  const std::vector<std::string_view> lines = splitOn(text, '\n');
  for (size_t line_no = 1; line_no <= lines.size(); ++line_no) {
    const std::string_view line = lines[line_no - 1];
    if (line.empty()) continue;
    const std::vector<std::string_view> f = splitOn(line, '\t');
    const auto bad = [&] {
      return Error(std::string(label) + " line " + std::to_string(line_no) +
                       " is not a start/trans/emit entry",
                   "regenerate the file with resources/jieba/generate.py");
    };
    if (f[0] == "start" && f.size() == 3 && stateIndex(f[1]) >= 0) {
      model.start[stateIndex(f[1])] = parseDouble(f[2], label, line_no);
    } else if (f[0] == "trans" && f.size() == 4 && stateIndex(f[1]) >= 0 && stateIndex(f[2]) >= 0) {
      model.trans[stateIndex(f[1])][stateIndex(f[2])] = parseDouble(f[3], label, line_no);
    } else if (f[0] == "emit" && f.size() == 4 && stateIndex(f[1]) >= 0) {
      const std::u32string c = py::decodeUtf8(f[2]);
      if (c.size() != 1) throw bad();
      model.emit[stateIndex(f[1])][c[0]] = parseDouble(f[3], label, line_no);
    } else {
      throw bad();
    }
  }
  for (const auto& table : model.emit) {
    if (table.empty()) {
      throw Error(std::string(label) + " has no emission table for every state",
                  "regenerate the file with resources/jieba/generate.py");
    }
  }
  return model;
}

void cutUnknown(const HmmModel& model, std::u32string_view text, std::vector<std::u32string>& out) {
  static const Regex han("([\\x{4E00}-\\x{9FD5}]+)", "jieba finalseg re_han");
  // Python's \d in a str pattern is any Unicode decimal digit (category Nd).
  static const Regex skip("([a-zA-Z0-9]+(?:\\.\\p{Nd}+)?%?)", "jieba finalseg re_skip");
  const std::string utf8 = py::encodeUtf8(text);
  for (const SplitPiece& block : splitByRegex(han, utf8)) {
    if (block.matched) {
      cutHan(model, py::decodeUtf8(block.text), out);
      continue;
    }
    for (const SplitPiece& piece : splitByRegex(skip, block.text)) {
      if (!piece.text.empty()) out.push_back(py::decodeUtf8(piece.text));
    }
  }
}

}  // namespace tandem::eval::jieba
