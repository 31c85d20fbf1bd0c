#pragma once
// Chinese word segmentation exactly as `jieba.cut(text)` (jieba 0.42.1, default mode: HMM on,
// cut_all off), which LLaMA-Factory's ROUGE runs on every prediction and label:
//
//   1. the text is split into blocks of [\u4E00-\u9FD5a-zA-Z0-9+#&._%-] and the rest;
//   2. a block of the rest yields "\r\n" and white space characters whole, every other
//      character alone;
//   3. a han block is cut along the most probable route through its DAG of dictionary words
//      (route score: sum of log(freq) - log(total), ties to the longer word); runs of single
//      characters that are not one dictionary word go through the HMM (finalseg: B/M/E/S
//      Viterbi over jieba's start/transition/emission tables) for unknown words.
//
// The dictionary and HMM tables are jieba's own, shipped in resources/jieba/ (generate.py
// regenerates them from the PyPI package). Regular expressions are jieba's, run by PCRE2.
// A loaded segmenter is immutable and safe to share between threads.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::eval {

class JiebaSegmenter {
 public:
  // Reads dict.txt.gz and hmm.txt.gz from `dir`. Throws tandem::Error when they are missing
  // or malformed.
  static JiebaSegmenter load(const std::filesystem::path& dir);
  // One segmenter per process for `dir`, loaded on first use (about half a second).
  static const JiebaSegmenter& shared(const std::filesystem::path& dir);

  JiebaSegmenter(JiebaSegmenter&&) noexcept;
  JiebaSegmenter& operator=(JiebaSegmenter&&) noexcept;
  ~JiebaSegmenter();

  // list(jieba.cut(text)), in code points.
  std::vector<std::u32string> cut(std::u32string_view text) const;
  // The same for UTF-8 text.
  std::vector<std::string> cut(std::string_view utf8) const;

 private:
  struct Impl;
  explicit JiebaSegmenter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::eval
