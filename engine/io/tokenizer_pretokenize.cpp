#include "engine/io/tokenizer_pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/io/bounded_json.h"
#include "engine/io/tokenizer_unicode_data.h"

namespace tandem::io::tokenizer_detail {
namespace {

using Json = nlohmann::json;

// ---------------------------------------------------------------- Unicode helpers

size_t utf8SequenceLength(std::string_view text, size_t pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  size_t len = 0;
  char32_t min = 0;
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    min = 0x10000;
  } else
    return 0;
  if (pos + len > text.size()) return 0;
  char32_t cp = b0 & (0x7F >> len);
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(text[pos + i]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return 0;
  return len;
}

std::u32string toCodePoints(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) out.push_back(nextCodePoint(text, pos));
  return out;
}

// ---------------------------------------------------------------- NFC / NFD
// UAX #15: full canonical decomposition, canonical ordering by combining class, then canonical
// composition. Hangul syllables (U+AC00..) are decomposed and composed arithmetically.

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr char32_t kSCount = kLCount * kNCount;

uint8_t combiningClass(char32_t cp) {
  const auto& table = nfc_data::kCombiningClasses;
  auto it = std::lower_bound(std::begin(table), std::end(table), cp,
                             [](const nfc_data::Combining& c, char32_t v) { return c.cp < v; });
  return it != std::end(table) && it->cp == cp ? it->ccc : 0;
}

void decomposeInto(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto& table = nfc_data::kDecompositions;
  auto it = std::lower_bound(std::begin(table), std::end(table), cp,
                             [](const nfc_data::Decomposition& d, char32_t v) { return d.cp < v; });
  if (it == std::end(table) || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  for (uint16_t i = 0; i < it->length; ++i)
    out.push_back(nfc_data::kDecompositionPool[it->offset + i]);
}

std::u32string canonicalDecomposition(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size() + 8);
  for (char32_t cp : text) decomposeInto(cp, out);
  // Canonical ordering: a stable sort of every run of non-starters by combining class.
  for (size_t i = 0; i < out.size();) {
    if (combiningClass(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < out.size() && combiningClass(out[end]) != 0) ++end;
    std::stable_sort(out.begin() + i, out.begin() + end,
                     [](char32_t a, char32_t b) { return combiningClass(a) < combiningClass(b); });
    i = end;
  }
  return out;
}

char32_t composePair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto& table = nfc_data::kCompositions;
  auto it = std::lower_bound(std::begin(table), std::end(table), std::pair{a, b},
                             [](const nfc_data::Composition& c, std::pair<char32_t, char32_t> v) {
                               return std::pair<char32_t, char32_t>{c.first, c.second} < v;
                             });
  return it != std::end(table) && it->first == a && it->second == b ? it->composite : 0;
}

std::u32string canonicalComposition(std::u32string decomposed) {
  if (decomposed.empty()) return decomposed;
  std::u32string out;
  out.reserve(decomposed.size());
  out.push_back(decomposed[0]);
  std::optional<size_t> starter;
  if (combiningClass(decomposed[0]) == 0) starter = 0;
  int last_ccc = combiningClass(decomposed[0]) == 0 ? 0 : 256;
  for (size_t i = 1; i < decomposed.size(); ++i) {
    const char32_t cp = decomposed[i];
    const int ccc = combiningClass(cp);
    // Blocked when a character of class >= ccc (or a starter) sits between the starter and cp.
    const bool adjacent = starter && *starter + 1 == out.size();
    if (starter && (adjacent || (last_ccc != 0 && last_ccc < ccc))) {
      if (char32_t composite = composePair(out[*starter], cp)) {
        out[*starter] = composite;
        continue;
      }
    }
    if (ccc == 0) starter = out.size();
    last_ccc = ccc;
    out.push_back(cp);
  }
  return out;
}

bool isAsciiOnly(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::string fromCodePoints(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) appendUtf8(out, cp);
  return out;
}

// ---------------------------------------------------------------- byte-level alphabet

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 324> cp_to_byte{};  // every alphabet code point is < 256 + 68
};

const ByteLevelTables& byteLevelTables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    t.cp_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    };
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp =
          printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      appendUtf8(t.byte_to_utf8[b], cp);
      t.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

std::string byteLevelMap(std::string_view text) {
  const auto& alphabet = byteLevelAlphabet();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out += alphabet[static_cast<unsigned char>(c)];
  return out;
}

// ---------------------------------------------------------------- splitting
// One (range, is_match) list per piece, as the crate's Pattern::find_matches returns it, then
// reshaped by a SplitDelimiterBehavior (tokenizers/src/tokenizer/normalizer.rs, `split`).

struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

std::vector<Span> matchesToSpans(std::string_view text,
                                 const std::vector<std::pair<size_t, size_t>>& matches) {
  std::vector<Span> spans;
  if (text.empty()) return {{0, 0, false}};
  size_t prev = 0;
  for (auto [begin, end] : matches) {
    if (prev != begin) spans.push_back({prev, begin, false});
    spans.push_back({begin, end, true});
    prev = end;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
  return spans;
}

std::vector<Span> applyBehavior(std::vector<Span> spans, SplitBehavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Isolated: return spans;
    case SplitBehavior::Removed:
      for (const Span& s : spans)
        if (!s.is_match) out.push_back(s);
      return out;
    case SplitBehavior::MergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back(s);
        previous_match = s.is_match;
      }
      return out;
    case SplitBehavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty())
          out.back().begin = it->begin;
        else
          out.push_back(*it);
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      return out;
    case SplitBehavior::Contiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back(s);
        previous_match = s.is_match;
      }
      return out;
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> findLiteral(std::string_view text,
                                                   std::string_view literal) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t pos = text.find(literal); pos != std::string_view::npos;
       pos = text.find(literal, pos)) {
    out.emplace_back(pos, pos + literal.size());
    pos += literal.size();
  }
  return out;
}

// A Split / Replace "pattern": {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;

  static Pattern fromJson(const Json& json, std::string_view where) {
    Pattern p;
    if (json.is_object() && json.contains("Regex") && json["Regex"].is_string()) {
      p.regex = std::make_shared<const Regex>(json["Regex"].get<std::string>(), where);
    } else if (json.is_object() && json.contains("String") && json["String"].is_string()) {
      p.literal = json["String"].get<std::string>();
    } else {
      throw Error(
          std::string(where) + ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}",
          "check the tokenizer.json; it may be truncated or hand-edited");
    }
    return p;
  }

  std::vector<std::pair<size_t, size_t>> findAll(std::string_view text) const {
    if (regex) return regex->findAll(text);
    if (literal.empty()) return {};
    return findLiteral(text, literal);
  }
};

SplitBehavior parseBehavior(const Json& json) {
  const std::string name = json.is_string() ? json.get<std::string>() : std::string();
  if (name == "Removed") return SplitBehavior::Removed;
  if (name == "Isolated") return SplitBehavior::Isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (name == "Contiguous") return SplitBehavior::Contiguous;
  throw Error("tokenizer.json: unknown Split behavior \"" + excerptForMessage(name) + "\"",
              "use one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

const Json& field(const Json& object, const char* key, std::string_view where) {
  auto it = object.find(key);
  if (it == object.end())
    throw Error(std::string(where) + " has no \"" + key + "\"",
                "the tokenizer.json looks damaged; re-download it");
  return *it;
}

std::string typeOf(const Json& json, std::string_view where) {
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string())
    throw Error(std::string(where) + " has no \"type\"",
                "the tokenizer.json looks damaged; re-download it");
  return json["type"].get<std::string>();
}

// GPT-2's pattern, which ByteLevel(use_regex=true) splits with.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

// ---------------------------------------------------------------- Unicode helpers (public)

void checkUtf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = utf8SequenceLength(text, pos);
    if (len == 0)
      throw Error("text is not valid UTF-8 (bad byte at offset " + std::to_string(pos) + ")",
                  "decode the input as UTF-8 (e.g. with errors='replace') before tokenizing");
    pos += len;
  }
}

char32_t nextCodePoint(std::string_view text, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  const size_t len = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x7F >> len);
  for (size_t i = 1; i < len; ++i)
    cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  pos += len;
  return cp;
}

void appendUtf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    if (const size_t len = utf8SequenceLength(bytes, pos)) {
      out.append(bytes.substr(pos, len));
      pos += len;
      continue;
    }
    // Skip the maximal prefix of a valid sequence (Unicode "substitution of maximal subparts").
    const auto b0 = static_cast<unsigned char>(bytes[pos]);
    size_t skip = 1;
    auto continuation = [&](size_t i, unsigned char lo, unsigned char hi) {
      if (pos + i >= bytes.size()) return false;
      const auto b = static_cast<unsigned char>(bytes[pos + i]);
      return b >= lo && b <= hi;
    };
    const unsigned char lo = b0 == 0xE0 ? 0xA0 : b0 == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = b0 == 0xED ? 0x9F : b0 == 0xF4 ? 0x8F : 0xBF;
    const size_t need = (b0 >= 0xC2 && b0 <= 0xDF)   ? 2
                        : (b0 >= 0xE0 && b0 <= 0xEF) ? 3
                        : (b0 >= 0xF0 && b0 <= 0xF4) ? 4
                                                     : 1;
    if (need > 1 && continuation(1, lo, hi)) {
      skip = 2;
      while (skip < need && continuation(skip, 0x80, 0xBF)) ++skip;
    }
    out += "\xEF\xBF\xBD";
    pos += skip;
  }
  return out;
}

bool isWhitespace(char32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string normalizeNfc(std::string_view text) {
  if (isAsciiOnly(text)) return std::string(text);
  return fromCodePoints(canonicalComposition(canonicalDecomposition(toCodePoints(text))));
}

std::string normalizeNfd(std::string_view text) {
  if (isAsciiOnly(text)) return std::string(text);
  return fromCodePoints(canonicalDecomposition(toCodePoints(text)));
}

const std::array<std::string, 256>& byteLevelAlphabet() { return byteLevelTables().byte_to_utf8; }

int byteLevelByte(char32_t cp) {
  const auto& t = byteLevelTables();
  return cp < t.cp_to_byte.size() ? t.cp_to_byte[cp] : -1;
}

// ---------------------------------------------------------------- Regex

namespace {
const char* propertyAdditions(char name) {
  for (const auto& addition : nfc_data::kPropertyAdditions)
    if (addition.name == name) return addition.items;
  return nullptr;
}
}  // namespace

std::string translatePattern(std::string_view p) {
  static constexpr std::string_view kSpace =
      R"(\t\n\x0B\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  std::string out;
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's')
        out += class_depth > 0 ? std::string(kSpace) : "[" + std::string(kSpace) + "]";
      else if (e == 'S' && class_depth == 0)
        out += "[^" + std::string(kSpace) + "]";
      else if ((e == 'p' || (e == 'P' && class_depth == 0)) && i + 3 < p.size() &&
               p[i + 1] == '{' && p[i + 3] == '}' && propertyAdditions(p[i + 2])) {
        // \p{L} -> [\p{L}<code points Oniguruma's newer Unicode adds>]
        const std::string items =
            "\\p{" + std::string(1, p[i + 2]) + "}" + propertyAdditions(p[i + 2]);
        out += class_depth > 0 ? items : (e == 'P' ? "[^" : "[") + items + "]";
        i += 3;
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[')
      ++class_depth;
    else if (c == ']' && class_depth > 0)
      --class_depth;
    out += c;
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, std::string_view where) : code_(std::make_unique<Code>()) {
  const std::string translated = translatePattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw Error(std::string(where) + ": regex does not compile: " +
                    reinterpret_cast<const char*>(message) + " (at offset " +
                    std::to_string(error_offset) + " of \"" + excerptForMessage(pattern) + "\")",
                "fix the pattern in tokenizer.json; Tandem compiles it with PCRE2 (UTF, UCP)");
  }
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
}

Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::findAll(std::string_view text) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  std::vector<std::pair<size_t, size_t>> out;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last_end = 0;
  std::optional<size_t> last_match_end;
  while (last_end <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK,
                         data.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_->code, subject, text.size(), last_end,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      throw Error("regex match failed (PCRE2 error " + std::to_string(rc) + ")",
                  "report this input");
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (begin == end && last_match_end == end) {
      // Oniguruma's find_iter: no empty match right after the previous one; step one character.
      last_end +=
          last_end < text.size() ? std::max<size_t>(1, utf8SequenceLength(text, last_end)) : 1;
      continue;
    }
    last_end = end;
    last_match_end = end;
    out.emplace_back(begin, end);
  }
  return out;
}

// ---------------------------------------------------------------- Normalizer

struct Normalizer::Step {
  enum class Kind : uint8_t { Nfc, Nfd, Prepend, Replace } kind;
  std::string text;  // Prepend: the prefix; Replace: the replacement
  Pattern pattern;   // Replace
};

Normalizer Normalizer::fromJson(const Json& json) {
  Normalizer n;
  if (json.is_null()) return n;
  const std::string type = typeOf(json, "tokenizer.json \"normalizer\"");
  if (type == "Sequence") {
    for (const Json& item : field(json, "normalizers", "normalizer Sequence")) {
      Normalizer inner = fromJson(item);
      n.steps_.insert(n.steps_.end(), inner.steps_.begin(), inner.steps_.end());
    }
  } else if (type == "NFC" || type == "NFD") {
    n.steps_.push_back(std::make_shared<const Step>(
        Step{type == "NFC" ? Step::Kind::Nfc : Step::Kind::Nfd, {}, {}}));
  } else if (type == "Prepend") {
    n.steps_.push_back(std::make_shared<const Step>(Step{
        Step::Kind::Prepend, field(json, "prepend", "Prepend normalizer").get<std::string>(), {}}));
  } else if (type == "Replace") {
    n.steps_.push_back(std::make_shared<const Step>(Step{
        Step::Kind::Replace, field(json, "content", "Replace normalizer").get<std::string>(),
        Pattern::fromJson(field(json, "pattern", "Replace normalizer"), "Replace normalizer")}));
  } else {
    throw Error("tokenizer.json: normalizer \"" + excerptForMessage(type) + "\" is not supported",
                "Tandem supports the normalizers NFC, NFD, Prepend, Replace and Sequence "
                "(see docs/tokenizer.md)");
  }
  return n;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const auto& step : steps_) {
    switch (step->kind) {
      case Step::Kind::Nfc: s = normalizeNfc(s); break;
      case Step::Kind::Nfd: s = normalizeNfd(s); break;
      case Step::Kind::Prepend:
        if (!s.empty()) s = step->text + s;
        break;
      case Step::Kind::Replace: {
        std::string out;
        size_t prev = 0;
        for (auto [begin, end] : step->pattern.findAll(s)) {
          out.append(s, prev, begin - prev);
          out += step->text;
          prev = end;
        }
        out.append(s, prev);
        s = std::move(out);
        break;
      }
    }
  }
  return s;
}

// ---------------------------------------------------------------- PreTokenizer

struct PreTokenizer::Step {
  enum class Kind : uint8_t { Split, ByteLevel } kind;
  Pattern pattern;  // Split (Digits is a Split on \p{N})
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = false;         // ByteLevel
};

PreTokenizer PreTokenizer::fromJson(const Json& json) {
  PreTokenizer p;
  if (json.is_null()) return p;
  const std::string type = typeOf(json, "tokenizer.json \"pre_tokenizer\"");
  Step step{};
  if (type == "Sequence") {
    for (const Json& item : field(json, "pretokenizers", "pre_tokenizer Sequence")) {
      PreTokenizer inner = fromJson(item);
      p.steps_.insert(p.steps_.end(), inner.steps_.begin(), inner.steps_.end());
    }
    return p;
  } else if (type == "Split") {
    step.kind = Step::Kind::Split;
    step.pattern =
        Pattern::fromJson(field(json, "pattern", "Split pre-tokenizer"), "Split pre-tokenizer");
    step.behavior = parseBehavior(field(json, "behavior", "Split pre-tokenizer"));
    step.invert = json.value("invert", false);
  } else if (type == "Digits") {
    // Rust char::is_numeric is the N* categories; per-digit Isolated, or runs (Contiguous).
    step.kind = Step::Kind::Split;
    const bool individual = json.value("individual_digits", false);
    step.pattern.regex = std::make_shared<const Regex>(individual ? R"(\p{N})" : R"(\p{N}+)",
                                                       "Digits pre-tokenizer");
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::ByteLevel;
    step.add_prefix_space = json.value("add_prefix_space", true);
    step.use_regex = json.value("use_regex", true);
    if (step.use_regex)
      step.pattern.regex = std::make_shared<const Regex>(kGpt2Pattern, "ByteLevel pre-tokenizer");
  } else {
    throw Error(
        "tokenizer.json: pre-tokenizer \"" + excerptForMessage(type) + "\" is not supported",
        "Tandem supports the pre-tokenizers Split, ByteLevel, Digits and Sequence "
        "(see docs/tokenizer.md)");
  }
  p.steps_.push_back(std::make_shared<const Step>(std::move(step)));
  return p;
}

std::vector<std::string> PreTokenizer::apply(std::string_view text) const {
  std::vector<std::string> pieces;
  if (!text.empty()) pieces.emplace_back(text);
  for (const auto& step : steps_) {
    std::vector<std::string> next;
    next.reserve(pieces.size() * 2);
    for (std::string& piece : pieces) {
      if (step->kind == Step::Kind::ByteLevel && step->add_prefix_space && piece.front() != ' ')
        piece.insert(0, " ");
      std::vector<Span> spans;
      if (step->kind == Step::Kind::Split || step->use_regex) {
        spans = matchesToSpans(piece, step->pattern.findAll(piece));
        if (step->invert)
          for (Span& s : spans) s.is_match = !s.is_match;
        spans = applyBehavior(std::move(spans), step->behavior);
      } else {
        spans = {{0, piece.size(), false}};
      }
      for (const Span& s : spans) {
        if (s.begin == s.end) continue;
        std::string_view sub = std::string_view(piece).substr(s.begin, s.end - s.begin);
        next.push_back(step->kind == Step::Kind::ByteLevel ? byteLevelMap(sub) : std::string(sub));
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace tandem::io::tokenizer_detail
