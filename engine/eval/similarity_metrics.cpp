#include "engine/eval/similarity_metrics.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/eval/jieba_segmenter.h"
#include "engine/eval/python_semantics.h"
#include "engine/io/tokenizer_pretokenize.h"

namespace tandem::eval {

namespace {

using io::tokenizer_detail::Regex;

// rouge_chinese Rouge.cut_sent: four re.sub passes that put "\n" between the two groups of each
// match, then rstrip and split on "\n". In every pattern the second group is the match's last
// code point, so the substitution inserts "\n" before it.
std::vector<std::u32string> cutSentences(std::u32string_view paragraph) {
  static const Regex patterns[] = {
      Regex("([。！？\\?])([^”’])", "rouge_chinese cut_sent 1"),
      Regex("(\\.{6})([^”’])", "rouge_chinese cut_sent 2"),
      Regex("(…{2})([^”’])", "rouge_chinese cut_sent 3"),
      Regex("([。！？\\?][”’])([^，。！？\\?])", "rouge_chinese cut_sent 4"),
  };
  std::string text = py::encodeUtf8(paragraph);
  for (const Regex& pattern : patterns) {
    std::string replaced;
    size_t last = 0;
    for (const auto& [begin, end] : pattern.findAll(text)) {
      size_t second = end - 1;  // the start of the last code point
      while ((static_cast<unsigned char>(text[second]) & 0xC0) == 0x80) --second;
      replaced.append(text, last, second - last);
      replaced.push_back('\n');
      replaced.append(text, second, end - second);
      last = end;
    }
    replaced.append(text, last, std::string::npos);
    text = std::move(replaced);
  }
  const std::u32string decoded = py::decodeUtf8(text);
  const std::u32string_view stripped = py::rstripWhitespace(decoded);
  std::vector<std::u32string> sentences;
  size_t start = 0;
  while (true) {
    const size_t newline = stripped.find(U'\n', start);
    sentences.emplace_back(stripped.substr(
        start, newline == std::u32string_view::npos ? std::u32string_view::npos : newline - start));
    if (newline == std::u32string_view::npos) return sentences;
    start = newline + 1;
  }
}

// _get_scores' preprocessing and _split_into_words: sentences with len > 0, each re-joined as
// " ".join(s.split()), then every sentence split on " " (an all-space sentence gives one empty
// word) and the words of all sentences concatenated. Words are returned as ids (same word, same
// id across both texts through `vocabulary`).
std::vector<int> rougeWords(std::u32string_view text,
                            std::unordered_map<std::u32string, int>& vocabulary) {
  std::vector<int> words;
  const auto id = [&](const std::u32string& word) {
    return vocabulary.try_emplace(word, static_cast<int>(vocabulary.size())).first->second;
  };
  for (const std::u32string& sentence : cutSentences(text)) {
    if (sentence.empty()) continue;
    const std::vector<std::u32string> parts = py::splitWhitespace(sentence);
    if (parts.empty()) {
      words.push_back(id(U""));
      continue;
    }
    for (const std::u32string& part : parts) words.push_back(id(part));
  }
  return words;
}

// _get_ngrams with exclusive=True: the set of distinct n-grams.
std::unordered_set<std::u32string> ngramSet(const std::vector<int>& words, size_t n) {
  std::unordered_set<std::u32string> set;
  for (size_t i = 0; i + n <= words.size(); ++i) {
    std::u32string key;
    for (size_t k = 0; k < n; ++k) key.push_back(static_cast<char32_t>(words[i + k]));
    set.insert(std::move(key));
  }
  return set;
}

// f_r_p_rouge_n's and rouge_l_summary_level's f: 2 * ((p * r) / (p + r + 1e-8)).
double fScore(double precision, double recall) {
  return 2.0 * ((precision * recall) / (precision + recall + 1e-8));
}

double rougeN(const std::vector<int>& hyp, const std::vector<int>& ref, size_t n) {
  const auto hyp_set = ngramSet(hyp, n);
  const auto ref_set = ngramSet(ref, n);
  size_t overlap = 0;
  for (const auto& gram : hyp_set) overlap += ref_set.count(gram);
  const double precision =
      hyp_set.empty() ? 0.0 : static_cast<double>(overlap) / static_cast<double>(hyp_set.size());
  const double recall =
      ref_set.empty() ? 0.0 : static_cast<double>(overlap) / static_cast<double>(ref_set.size());
  return fScore(precision, recall);
}

size_t lcsLength(const std::vector<int>& x, const std::vector<int>& y) {
  std::vector<size_t> previous(y.size() + 1, 0), current(y.size() + 1, 0);
  for (size_t i = 1; i <= x.size(); ++i) {
    for (size_t j = 1; j <= y.size(); ++j) {
      current[j] =
          x[i - 1] == y[j - 1] ? previous[j - 1] + 1 : std::max(previous[j], current[j - 1]);
    }
    std::swap(previous, current);
  }
  return previous[y.size()];
}

// rouge_l_summary_level: LCS of the whole word sequences (reference first, as rouge_chinese).
double rougeL(const std::vector<int>& hyp, const std::vector<int>& ref) {
  const double llcs = static_cast<double>(lcsLength(ref, hyp));
  const double recall = llcs / static_cast<double>(ref.size());
  const double precision = llcs / static_cast<double>(hyp.size());
  return fScore(precision, recall);
}

// modified_precision's numerator and denominator for one n-gram order.
std::pair<int64_t, int64_t> modifiedPrecision(std::u32string_view hyp, std::u32string_view ref,
                                              size_t n) {
  std::unordered_map<std::u32string_view, int64_t> hyp_counts, ref_counts;
  for (size_t i = 0; i + n <= hyp.size(); ++i) ++hyp_counts[hyp.substr(i, n)];
  for (size_t i = 0; i + n <= ref.size(); ++i) ++ref_counts[ref.substr(i, n)];
  int64_t clipped = 0, total = 0;
  for (const auto& [gram, count] : hyp_counts) {
    const auto it = ref_counts.find(gram);
    clipped += std::min(count, it == ref_counts.end() ? int64_t{0} : it->second);
    total += count;
  }
  return {clipped, std::max<int64_t>(1, total)};
}

}  // namespace

RougeScores rougeChinese(std::u32string_view hypothesis, std::u32string_view reference) {
  std::unordered_map<std::u32string, int> vocabulary;
  const std::vector<int> hyp = rougeWords(hypothesis, vocabulary);
  const std::vector<int> ref = rougeWords(reference, vocabulary);
  if (hyp.empty() || ref.empty()) return {};  // rouge_chinese raises; callers check first
  return {rougeN(hyp, ref, 1), rougeN(hyp, ref, 2), rougeL(hyp, ref)};
}

std::array<double, 4> sentenceBleuChars(std::u32string_view hypothesis,
                                        std::u32string_view reference) {
  std::array<int64_t, 4> numerators{}, denominators{};
  for (size_t n = 1; n <= 4; ++n) {
    std::tie(numerators[n - 1], denominators[n - 1]) = modifiedPrecision(hypothesis, reference, n);
  }
  if (numerators[0] == 0) return {};  // corpus_bleu: no matching unigram -> 0
  // brevity_penalty with the one reference as the closest length.
  const auto hyp_len = static_cast<double>(hypothesis.size());
  const auto ref_len = static_cast<double>(reference.size());
  const double bp = hypothesis.size() > reference.size() ? 1.0 : std::exp(1 - ref_len / hyp_len);
  // method3 (NIST geometric smoothing): the k-th zero precision becomes 1 / (2^k * denominator).
  std::array<double, 4> precision{};
  int64_t zero_rank = 1;
  for (size_t i = 0; i < 4; ++i) {
    if (numerators[i] == 0) {
      precision[i] = 1.0 / static_cast<double>((int64_t{1} << zero_rank) * denominators[i]);
      ++zero_rank;
    } else {
      precision[i] = static_cast<double>(numerators[i]) / static_cast<double>(denominators[i]);
    }
  }
  std::array<double, 4> bleu{};
  for (size_t order = 1; order <= 4; ++order) {
    // nltk: bp * exp(fsum(w_i * log(p_i))) with w_i = 1/order (a Python float).
    const double weight = 1.0 / static_cast<double>(order);
    std::array<double, 4> terms{};
    for (size_t i = 0; i < order; ++i) terms[i] = weight * std::log(precision[i]);
    bleu[order - 1] = bp * std::exp(py::fsum(std::span<const double>(terms.data(), order)));
  }
  return bleu;
}

SimilarityScores scoreSimilarity(const JiebaSegmenter& jieba, std::string_view prediction,
                                 std::string_view label) {
  const std::u32string pred = py::decodeUtf8(prediction);
  const std::u32string ref = py::decodeUtf8(label);
  const auto joined = [&](const std::u32string& text) {  // " ".join(jieba.cut(text))
    std::u32string out;
    bool first = true;
    for (const std::u32string& word : jieba.cut(text)) {
      if (!first) out.push_back(U' ');
      out += word;
      first = false;
    }
    return out;
  };
  const std::u32string hypothesis = joined(pred);
  const std::u32string reference = joined(ref);
  SimilarityScores scores;
  if (!py::splitWhitespace(hypothesis).empty() && !py::splitWhitespace(reference).empty()) {
    const RougeScores rouge = rougeChinese(hypothesis, reference);
    scores.rouge_1 = py::roundDecimal(rouge.rouge_1 * 100, 4);
    scores.rouge_2 = py::roundDecimal(rouge.rouge_2 * 100, 4);
    scores.rouge_l = py::roundDecimal(rouge.rouge_l * 100, 4);
  }
  const std::array<double, 4> bleu = sentenceBleuChars(pred, ref);
  for (size_t i = 0; i < 4; ++i) scores.bleu[i] = py::roundDecimal(bleu[i] * 100, 4);
  return scores;
}

}  // namespace tandem::eval
