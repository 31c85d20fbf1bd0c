#pragma once
// The text stages of a Hugging Face tokenizer.json that run before the BPE model: normalizers
// (NFC, NFD, Prepend, Replace, Sequence) and pre-tokenizers (Split, ByteLevel, Digits, Sequence),
// with the exact semantics of the Rust `tokenizers` crate (0.23), plus the byte-level alphabet that
// the ByteLevel pre-tokenizer and decoder share. Internal to tandem_io: Tokenizer is the public
// API.
//
// Regexes run on PCRE2 (UTF + UCP, JIT). `tokenizers` runs them on Oniguruma, which differs in two
// ways that change ids, so patterns are rewritten before compiling (translatePattern):
//   - its `\s` is exactly the Unicode White_Space property (PCRE2's adds U+180E);
//   - its Unicode tables are newer (15/16 vs PCRE2 10.42's 14), so \p{L}, \p{M}, \p{N}, \p{P},
//     \p{S} get the code points assigned since then added (tokenizer_unicode_data.h).

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::io::tokenizer_detail {

// ---- Unicode helpers ----

// Throws tandem::Error naming the first bad byte offset when `text` is not valid UTF-8.
void checkUtf8(std::string_view text);
// Decodes the code point starting at text[pos] (valid UTF-8 assumed) and advances pos.
char32_t nextCodePoint(std::string_view text, size_t& pos);
void appendUtf8(std::string& out, char32_t cp);
// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
std::string utf8Lossy(std::string_view bytes);
// Rust's char::is_whitespace (the Unicode White_Space property).
bool isWhitespace(char32_t cp);

// Canonical normalization as the `tokenizers` package applies it (tables:
// tokenizer_unicode_data.h).
std::string normalizeNfc(std::string_view text);
std::string normalizeNfd(std::string_view text);

// ---- byte-level alphabet (GPT-2 bytes_to_unicode) ----

// kByteToUtf8[b]: the UTF-8 of the printable code point that stands for byte b.
const std::array<std::string, 256>& byteLevelAlphabet();
// The byte a code point of that alphabet stands for, or -1 when it is not one of them.
int byteLevelByte(char32_t cp);

// ---- regex ----

// A compiled PCRE2 pattern (UTF, UCP, JIT). Immutable and safe to share between threads.
class Regex {
 public:
  // Throws tandem::Error when the pattern does not compile; `where` names it in the message.
  Regex(std::string_view pattern, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches [begin, end) in byte offsets, in the order Oniguruma's find_iter
  // yields them (an empty match right after the previous match is skipped).
  std::vector<std::pair<size_t, size_t>> findAll(std::string_view text) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

// Rewrites an Oniguruma pattern for PCRE2: `\s` / `\S` become the White_Space set, \p{L|M|N|P|S}
// (and \P outside classes) get the newer code points added.
std::string translatePattern(std::string_view onig_pattern);

// ---- normalizer ----

class Normalizer {
 public:
  // `json` is tokenizer.json's "normalizer" (null = none). Throws tandem::Error naming an
  // unsupported normalizer type.
  static Normalizer fromJson(const nlohmann::json& json);

  bool empty() const { return steps_.empty(); }
  std::string apply(std::string_view text) const;

 private:
  struct Step;
  std::vector<std::shared_ptr<const Step>> steps_;
};

// ---- pre-tokenizer ----

// SplitDelimiterBehavior of the `tokenizers` crate.
enum class SplitBehavior : uint8_t {
  Removed,
  Isolated,
  MergedWithPrevious,
  MergedWithNext,
  Contiguous
};

class PreTokenizer {
 public:
  // `json` is tokenizer.json's "pre_tokenizer" (null = none).
  static PreTokenizer fromJson(const nlohmann::json& json);

  // Splits one normalized segment into the words the model tokenizes (byte-level mapped when a
  // ByteLevel step is present). Empty words are dropped, as the crate does.
  std::vector<std::string> apply(std::string_view text) const;

 private:
  struct Step;
  std::vector<std::shared_ptr<const Step>> steps_;
};

}  // namespace tandem::io::tokenizer_detail
