#include "engine/eval/jieba_segmenter.h"

#include <zlib.h>

#include <charconv>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "engine/core/error.h"
#include "engine/eval/jieba_hmm.h"
#include "engine/eval/python_semantics.h"

namespace tandem::eval {

namespace {

using io::tokenizer_detail::Regex;

struct U32Hash {
  using is_transparent = void;
  size_t operator()(std::u32string_view s) const { return std::hash<std::u32string_view>{}(s); }
};
struct U32Equal {
  using is_transparent = void;
  bool operator()(std::u32string_view a, std::u32string_view b) const { return a == b; }
};
// jieba's FREQ: every dictionary word with its count, and every prefix of a word with 0.
using FrequencyMap = std::unordered_map<std::u32string, int64_t, U32Hash, U32Equal>;

std::string readGzip(const std::filesystem::path& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw Error("cannot open " + path.string() + ": the jieba tables are missing",
                "reinstall Tandem, or set TANDEM_RESOURCES to the folder that holds jieba/");
  }
  std::string text;
  char buffer[1 << 16];
  int n = 0;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0)
    text.append(buffer, static_cast<size_t>(n));
  int error_code = Z_OK;
  const std::string reason = n < 0 ? gzerror(file, &error_code) : "";
  gzclose(file);
  if (n < 0) {
    throw Error("cannot read " + path.string() + ": " + reason,
                "the file is damaged; regenerate it with resources/jieba/generate.py");
  }
  return text;
}

// jieba's gen_pfdict over "word freq" lines: the total counts repeated words every time, the
// map keeps the last count.
void parseDictionary(std::string_view text, const std::string& label, FrequencyMap& freq,
                     int64_t& total) {
  const std::vector<std::string_view> lines = jieba::splitOn(text, '\n');
  for (size_t line_no = 1; line_no <= lines.size(); ++line_no) {
    const std::string_view line = lines[line_no - 1];
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    int64_t count = 0;
    const std::string_view count_text =
        space == std::string_view::npos ? std::string_view{} : line.substr(space + 1);
    const auto [ptr, ec] =
        std::from_chars(count_text.data(), count_text.data() + count_text.size(), count);
    if (space == 0 || space == std::string_view::npos || ec != std::errc() ||
        ptr != count_text.data() + count_text.size() || count < 0) {
      throw Error(label + " line " + std::to_string(line_no) + " is not \"word frequency\"",
                  "regenerate the file with resources/jieba/generate.py");
    }
    const std::u32string word = py::decodeUtf8(line.substr(0, space));
    freq[word] = count;
    total += count;
    for (size_t length = 1; length < word.size(); ++length)
      freq.try_emplace(word.substr(0, length), 0);
  }
  if (total <= 0)
    throw Error(label + " holds no words", "regenerate the file with resources/jieba/generate.py");
}

}  // namespace

struct JiebaSegmenter::Impl {
  FrequencyMap freq;
  int64_t total = 0;
  double log_total = 0;
  jieba::HmmModel hmm;

  int64_t frequency(std::u32string_view word) const {
    const auto it = freq.find(word);
    return it == freq.end() ? 0 : it->second;
  }
  bool contains(std::u32string_view word) const { return freq.find(word) != freq.end(); }

  // get_DAG: for each start k, the ends i of the dictionary words sentence[k..i].
  std::vector<std::vector<size_t>> dag(std::u32string_view sentence) const {
    const size_t n = sentence.size();
    std::vector<std::vector<size_t>> ends(n);
    for (size_t k = 0; k < n; ++k) {
      for (size_t i = k; i < n && contains(sentence.substr(k, i + 1 - k)); ++i) {
        if (frequency(sentence.substr(k, i + 1 - k)) != 0) ends[k].push_back(i);
      }
      if (ends[k].empty()) ends[k].push_back(k);
    }
    return ends;
  }

  // calc: the best route from every position to the end; returns the end of each step's word.
  std::vector<size_t> route(std::u32string_view sentence,
                            const std::vector<std::vector<size_t>>& dag) const {
    const size_t n = sentence.size();
    std::vector<double> score(n + 1, 0.0);
    std::vector<size_t> word_end(n + 1, 0);
    for (size_t idx = n; idx-- > 0;) {
      bool first = true;
      for (const size_t x : dag[idx]) {
        const int64_t count = frequency(sentence.substr(idx, x + 1 - idx));
        // Python: log(FREQ.get(word) or 1) - logtotal + route[x + 1][0], max over (score, x).
        const double s =
            std::log(static_cast<double>(count != 0 ? count : 1)) - log_total + score[x + 1];
        if (first || s > score[idx] || (s == score[idx] && x > word_end[idx])) {
          score[idx] = s;
          word_end[idx] = x;
          first = false;
        }
      }
    }
    return word_end;
  }

  // A run of single-character steps: one dictionary word splits into characters, anything else
  // goes to the HMM (jieba's `if not self.FREQ.get(buf)`).
  void flushSingles(std::u32string_view buf, std::vector<std::u32string>& out) const {
    if (buf.empty()) return;
    if (buf.size() == 1) {
      out.emplace_back(buf);
    } else if (frequency(buf) == 0) {
      jieba::cutUnknown(hmm, buf, out);
    } else {
      for (const char32_t c : buf) out.emplace_back(1, c);
    }
  }

  // __cut_DAG on one han block.
  void cutBlock(std::u32string_view sentence, std::vector<std::u32string>& out) const {
    const std::vector<size_t> word_end = route(sentence, dag(sentence));
    size_t buf_start = 0, x = 0;
    while (x < sentence.size()) {
      const size_t y = word_end[x] + 1;
      if (y - x > 1) {
        flushSingles(sentence.substr(buf_start, x - buf_start), out);
        out.emplace_back(sentence.substr(x, y - x));
        buf_start = y;
      }
      x = y;
    }
    flushSingles(sentence.substr(buf_start), out);
  }
};

JiebaSegmenter::JiebaSegmenter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JiebaSegmenter::JiebaSegmenter(JiebaSegmenter&&) noexcept = default;
JiebaSegmenter& JiebaSegmenter::operator=(JiebaSegmenter&&) noexcept = default;
JiebaSegmenter::~JiebaSegmenter() = default;

JiebaSegmenter JiebaSegmenter::load(const std::filesystem::path& dir) {
  auto impl = std::make_unique<Impl>();
  const std::filesystem::path dict_path = dir / "dict.txt.gz";
  const std::filesystem::path hmm_path = dir / "hmm.txt.gz";
  impl->freq.reserve(600000);
  parseDictionary(readGzip(dict_path), dict_path.string(), impl->freq, impl->total);
  impl->log_total = std::log(static_cast<double>(impl->total));
  impl->hmm = jieba::HmmModel::parse(readGzip(hmm_path), hmm_path.string());
  return JiebaSegmenter(std::move(impl));
}

const JiebaSegmenter& JiebaSegmenter::shared(const std::filesystem::path& dir) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::unique_ptr<JiebaSegmenter>> loaded;
  const std::lock_guard lock(mutex);
  std::unique_ptr<JiebaSegmenter>& slot =
      loaded[std::filesystem::absolute(dir).lexically_normal().string()];
  if (!slot) slot = std::make_unique<JiebaSegmenter>(load(dir));
  return *slot;
}

std::vector<std::u32string> JiebaSegmenter::cut(std::u32string_view text) const {
  // jieba's re_han_default and re_skip_default; \s spelled out as Python's str.isspace() set.
  static const Regex han("([\\x{4E00}-\\x{9FD5}a-zA-Z0-9+#&\\._%\\-]+)", "jieba re_han_default");
  static const Regex skip(
      "(\\r\\n|[\\t\\n\\x{0B}\\f\\r\\x{1C}-\\x{1F} \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
      "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}])",
      "jieba re_skip_default");
  std::vector<std::u32string> out;
  const std::string utf8 = py::encodeUtf8(text);
  for (const jieba::SplitPiece& block : jieba::splitByRegex(han, utf8)) {
    if (block.text.empty()) continue;
    if (block.matched) {
      impl_->cutBlock(py::decodeUtf8(block.text), out);
      continue;
    }
    for (const jieba::SplitPiece& piece : jieba::splitByRegex(skip, block.text)) {
      if (piece.matched) {
        out.push_back(py::decodeUtf8(piece.text));
      } else {
        for (const char32_t c : py::decodeUtf8(piece.text)) out.emplace_back(1, c);
      }
    }
  }
  return out;
}

std::vector<std::string> JiebaSegmenter::cut(std::string_view utf8) const {
  std::vector<std::string> words;
  for (const std::u32string& word : cut(py::decodeUtf8(utf8)))
    words.push_back(py::encodeUtf8(word));
  return words;
}

}  // namespace tandem::eval
