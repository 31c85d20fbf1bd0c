#include "engine/io/tokenizer.h"

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <shared_mutex>

#include "engine/core/error.h"
#include "engine/io/tokenizer_impl.h"
#include "engine/io/tokenizer_pretokenize.h"

namespace tandem::io {
namespace {

using namespace tokenizer_detail;

constexpr size_t kCacheMaxEntries = 1 << 16;  // words; the cache is cleared when full
constexpr size_t kCacheMaxWordBytes = 256;    // longer words are merged every time

}  // namespace

// ---------------------------------------------------------------- encoding

// AddedVocabulary::find_matches of the crate: leftmost-longest matches, single_word / lstrip /
// rstrip adjustments, and the text between them.
std::vector<Segment> Tokenizer::Impl::splitAdded(std::string_view text,
                                                 const TokenTrie& trie) const {
  if (trie.empty()) return {{std::string(text), -1}};
  // Rust regex's Unicode \w (the crate's `\w$` / `^\w`); PCRE2 10.42's \w lacks marks and Pc.
  static constexpr std::string_view kWord = R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])";
  static const Regex word_end(std::string(kWord) + R"(\z)", "added tokens");
  static const Regex word_start(R"(\A)" + std::string(kWord), "added tokens");
  std::vector<Segment> out;
  size_t start_offset = 0;
  for (size_t pos = 0; pos < text.size();) {
    auto [index, length] = trie.longestAt(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = added[static_cast<size_t>(index)];
    size_t start = pos, stop = pos + length;
    pos = stop;
    if (token.single_word) {
      const bool start_ok = start == 0 || word_end.findAll(text.substr(0, start)).empty();
      const bool stop_ok = stop == text.size() || word_start.findAll(text.substr(stop)).empty();
      if (!start_ok || !stop_ok) continue;
    }
    if (token.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t p = s - 1;
        while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!isWhitespace(nextCodePoint(text, q))) break;
        s = p;
      }
      start = std::max(s, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t q = stop;
        if (!isWhitespace(nextCodePoint(text, q))) break;
        stop = q;
      }
    }
    if (start_offset < start)
      out.push_back({std::string(text.substr(start_offset, start - start_offset)), -1});
    out.push_back({std::string(), token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({std::string(text.substr(start_offset)), -1});
  return out;
}

// BPE Word::merge_all of the crate: a heap of (rank, position); stale entries are skipped.
std::vector<int32_t> Tokenizer::Impl::mergeWord(std::string_view word) const {
  struct Symbol {
    int32_t id;
    int64_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  std::optional<int32_t> pending_unk;  // fuse_unk joins runs of unknown characters
  auto push = [&](int32_t id) {
    symbols.push_back({id, static_cast<int64_t>(symbols.size()) - 1,
                       static_cast<int64_t>(symbols.size()) + 1, true});
  };
  for (size_t pos = 0; pos < word.size();) {
    const size_t begin = pos;
    nextCodePoint(word, pos);
    const std::string_view ch = word.substr(begin, pos - begin);
    if (auto it = vocab.find(std::string(ch)); it != vocab.end()) {
      push(it->second);
      pending_unk.reset();
      continue;
    }
    if (byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char b) {
          return byte_fallback_ids[static_cast<unsigned char>(b)] >= 0;
        })) {
      for (char b : ch) push(byte_fallback_ids[static_cast<unsigned char>(b)]);
      pending_unk.reset();
      continue;
    }
    if (!unk_id) continue;  // the crate drops characters it cannot represent
    if (fuse_unk && pending_unk) continue;
    push(*unk_id);
    pending_unk = *unk_id;
  }
  if (!symbols.empty()) symbols.back().next = -1;

  struct Merge {
    int32_t rank;
    size_t pos;
    int32_t new_id;
  };
  auto worse = [](const Merge& a, const Merge& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Merge, std::vector<Merge>, decltype(worse)> queue(worse);
  auto consider = [&](size_t left) {
    const int64_t right = symbols[left].next;
    if (right < 0) return;
    auto it = merges.find(pairKey(symbols[left].id, symbols[static_cast<size_t>(right)].id));
    if (it != merges.end()) queue.push({it->second.first, left, it->second.second});
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) consider(i);
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    auto it = merges.find(pairKey(left.id, right.id));
    if (it == merges.end() || it->second.second != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0)
      symbols[static_cast<size_t>(left.next)].prev = static_cast<int64_t>(top.pos);
    if (left.prev >= 0) consider(static_cast<size_t>(left.prev));
    consider(top.pos);
  }
  std::vector<int32_t> ids;
  for (const Symbol& s : symbols)
    if (s.alive) ids.push_back(s.id);
  return ids;
}

void Tokenizer::Impl::encodeWord(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    if (auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex);
    if (auto it = cache.find(word); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = mergeWord(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex);
    if (cache.size() >= kCacheMaxEntries) cache.clear();
    cache.emplace(word, std::move(ids));
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  checkUtf8(text);
  const Impl& d = *impl_;
  std::vector<int32_t> ids;
  for (const Segment& raw : d.splitAdded(text, d.raw_trie)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const std::string normalized = d.normalizer.empty() ? raw.text : d.normalizer.apply(raw.text);
    for (const Segment& seg : d.splitAdded(normalized, d.normalized_trie)) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
        continue;
      }
      for (const std::string& word : d.pre_tokenizer.apply(seg.text)) d.encodeWord(word, ids);
    }
  }
  if (!add_special_tokens || d.single_template.empty()) return ids;
  std::vector<int32_t> out;
  for (const TemplateItem& item : d.single_template) {
    if (item.is_sequence)
      out.insert(out.end(), ids.begin(), ids.end());
    else
      out.insert(out.end(), item.ids.begin(), item.ids.end());
  }
  return out;
}

// ---------------------------------------------------------------- decoding

std::string Tokenizer::Impl::decodeTokens(std::vector<std::string> tokens) const {
  if (!has_decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const Decoder& dec : decoders) {
    std::vector<std::string> next;
    switch (dec.kind) {
      case DecodeStep::ByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) {
          std::string mapped;
          bool ok = true;
          for (size_t pos = 0; pos < t.size() && ok;) {
            const int b = byteLevelByte(nextCodePoint(t, pos));
            if (b < 0)
              ok = false;
            else
              mapped += static_cast<char>(b);
          }
          bytes += ok ? mapped : t;
        }
        next.push_back(utf8Lossy(bytes));
        break;
      }
      case DecodeStep::ByteFallback: {
        std::string pending;
        size_t pending_count = 0;
        auto flush = [&] {
          if (pending_count == 0) return;
          if (utf8Lossy(pending) == pending)
            next.push_back(pending);
          else
            for (size_t i = 0; i < pending_count; ++i) next.emplace_back("\xEF\xBF\xBD");
          pending.clear();
          pending_count = 0;
        };
        for (const std::string& t : tokens) {
          unsigned value = 0;
          if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' &&
              std::sscanf(t.c_str() + 3, "%2X", &value) == 1) {
            pending += static_cast<char>(value);
            ++pending_count;
          } else {
            flush();
            next.push_back(t);
          }
        }
        flush();
        break;
      }
      case DecodeStep::Fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        next.push_back(std::move(all));
        break;
      }
      case DecodeStep::Replace:
        for (std::string t : tokens) {
          std::string out;
          size_t prev = 0;
          for (size_t p = dec.pattern.empty() ? std::string::npos : t.find(dec.pattern);
               p != std::string::npos; p = t.find(dec.pattern, prev)) {
            out.append(t, prev, p - prev);
            out += dec.content;
            prev = p + dec.pattern.size();
          }
          out.append(t, prev);
          next.push_back(std::move(out));
        }
        break;
      case DecodeStep::Strip:
        for (std::string t : tokens) {
          for (size_t i = 0; i < dec.start && t.starts_with(dec.content) && !dec.content.empty();
               ++i)
            t.erase(0, dec.content.size());
          for (size_t i = 0; i < dec.stop && t.ends_with(dec.content) && !dec.content.empty(); ++i)
            t.resize(t.size() - dec.content.size());
          next.push_back(std::move(t));
        }
        break;
    }
    tokens = std::move(next);
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (skip_special_tokens && isSpecial(id)) continue;
    tokens.push_back(idToToken(id));
  }
  return impl_->decodeTokens(std::move(tokens));
}

// ---------------------------------------------------------------- lookups

std::optional<int32_t> Tokenizer::tokenToId(std::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::idToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size() ||
      impl_->id_to_token[static_cast<size_t>(id)].empty())
    throw Error("token id " + std::to_string(id) + " is not in the vocabulary of " + impl_->label,
                "the ids come from a different tokenizer or model");
  return impl_->id_to_token[static_cast<size_t>(id)];
}

int64_t Tokenizer::vocabSize() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

bool Tokenizer::isSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_is_special.size() &&
         impl_->id_is_special[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::eosId() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::bosId() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::padId() const { return impl_->pad; }

}  // namespace tandem::io
