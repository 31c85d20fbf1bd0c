#include "engine/io/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>

#include "engine/core/error.h"
#include "engine/io/gguf_model.h"
#include "engine/io/tokenizer_pretokenize.h"

namespace tandem::io {
namespace {

using Json = nlohmann::json;
using namespace tokenizer_detail;

constexpr size_t kCacheMaxEntries = 1 << 16;  // words; the cache is cleared when full
constexpr size_t kCacheMaxWordBytes = 256;    // longer words are merged every time

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// Byte trie over added-token contents, searched leftmost-longest like the crate's Aho-Corasick.
class TokenTrie {
 public:
  void insert(std::string_view key, size_t token_index) {
    size_t node = 0;
    for (char c : key) {
      auto [it, inserted] =
          nodes_[node].children.try_emplace(static_cast<unsigned char>(c), nodes_.size());
      if (inserted) nodes_.emplace_back();
      node = it->second;
    }
    nodes_[node].token_index = static_cast<int64_t>(token_index);
  }
  bool empty() const { return nodes_.size() == 1; }
  // Longest key starting at text[pos]: (token index, length), or index -1.
  std::pair<int64_t, size_t> longestAt(std::string_view text, size_t pos) const {
    std::pair<int64_t, size_t> best{-1, 0};
    size_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      auto it = nodes_[node].children.find(static_cast<unsigned char>(text[i]));
      if (it == nodes_[node].children.end()) break;
      node = it->second;
      if (nodes_[node].token_index >= 0) best = {nodes_[node].token_index, i + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    std::map<unsigned char, size_t> children;
    int64_t token_index = -1;
  };
  std::vector<Node> nodes_{1};
};

// One segment of the input: an added token (id >= 0) or text for the normalizer/model.
struct Segment {
  std::string text;
  int32_t id = -1;
};

enum class DecodeStep : uint8_t { ByteLevel, Replace, ByteFallback, Fuse, Strip };
struct Decoder {
  DecodeStep kind;
  std::string pattern, content;  // Replace (literal pattern); Strip: content
  size_t start = 0, stop = 0;    // Strip
};

// One item of a TemplateProcessing "single" template: the sequence, or fixed special ids.
struct TemplateItem {
  bool is_sequence = false;
  std::vector<int32_t> ids;
};

std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error("cannot read " + path.string(), "check that the file exists and is readable");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Json parseJson(std::string_view text, std::string_view label) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw Error(std::string(label) + " is not valid JSON: " + e.what(),
                "re-download the file; it may be truncated or corrupted");
  }
}

[[noreturn]] void unsupported(std::string_view label, std::string_view what) {
  throw Error(
      std::string(label) + ": " + std::string(what) + " is not supported",
      "Tandem reads BPE tokenizers (byte-level or with byte fallback); see docs/tokenizer.md");
}

}  // namespace

struct Tokenizer::Impl {
  std::string label;
  std::unordered_map<std::string, int32_t> vocab;  // model vocab and added tokens
  std::vector<std::string> id_to_token;            // "" for unused ids
  std::vector<uint8_t> id_is_special;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>>
      merges;  // (left, right) -> (rank, merged)
  std::optional<int32_t> unk_id;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  std::array<int32_t, 256> byte_fallback_ids{};  // <0xXX> ids, -1 when absent

  std::vector<AddedToken> added;
  TokenTrie raw_trie, normalized_trie;  // normalized=false on raw text / normalized=true after
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::vector<TemplateItem> single_template;  // empty: no post-processing
  bool has_decoder = false;
  std::vector<Decoder> decoders;
  std::optional<int32_t> eos, bos, pad;

  mutable std::shared_mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  static uint64_t pairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void loadModel(const Json& model);
  void loadAddedTokens(const Json& tokens);
  void loadPostProcessor(const Json& post);
  void loadDecoder(const Json& decoder);
  void applyConfig(const Json& config);

  std::vector<Segment> splitAdded(std::string_view text, const TokenTrie& trie) const;
  void encodeWord(const std::string& word, std::vector<int32_t>& out) const;
  std::vector<int32_t> mergeWord(std::string_view word) const;
  std::string decodeTokens(std::vector<std::string> tokens) const;
};

// ---------------------------------------------------------------- loading

void Tokenizer::Impl::loadModel(const Json& model) {
  const std::string type = model.value("type", std::string(model.contains("merges") ? "BPE" : ""));
  if (type != "BPE") unsupported(label, "model type \"" + type + "\" (only BPE)");
  if (!model.value("continuing_subword_prefix", Json()).is_null() ||
      !model.value("end_of_word_suffix", Json()).is_null())
    unsupported(label, "BPE continuing_subword_prefix / end_of_word_suffix");
  if (!model.value("dropout", Json()).is_null() && model["dropout"].get<double>() != 0.0)
    unsupported(label, "BPE dropout");
  byte_fallback = model.value("byte_fallback", false);
  fuse_unk = model.value("fuse_unk", false);
  ignore_merges = model.value("ignore_merges", false);

  const Json& v = model.at("vocab");
  vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) vocab.emplace(it.key(), it.value().get<int32_t>());
  for (const auto& [token, id] : vocab) {
    if (id < 0)
      throw Error(label + ": negative id for \"" + token + "\"", "the tokenizer.json is damaged");
    if (static_cast<size_t>(id) >= id_to_token.size())
      id_to_token.resize(static_cast<size_t>(id) + 1);
    id_to_token[static_cast<size_t>(id)] = token;
  }
  const std::string unk =
      model.value("unk_token", Json()).is_string() ? model["unk_token"].get<std::string>() : "";
  if (!unk.empty()) {
    auto it = vocab.find(unk);
    if (it == vocab.end())
      throw Error(label + ": unk_token \"" + unk + "\" is not in the vocab",
                  "the tokenizer.json is damaged");
    unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab.find(name);
    byte_fallback_ids[b] = it == vocab.end() ? -1 : it->second;
  }

  const Json& m = model.at("merges");
  merges.reserve(m.size());
  int32_t rank = 0;
  for (const Json& merge : m) {
    std::string left, right;
    if (merge.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos)
        throw Error(label + ": bad merge \"" + s + "\"", "the tokenizer.json is damaged");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {  // ["a", "b"]
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      throw Error(label + ": bad merge entry " + merge.dump(), "the tokenizer.json is damaged");
    }
    auto l = vocab.find(left), r = vocab.find(right), lr = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || lr == vocab.end())
      throw Error(
          label + ": merge \"" + left + " " + right + "\" uses tokens missing from the vocab",
          "the tokenizer.json is damaged; re-download it");
    merges.try_emplace(pairKey(l->second, r->second), rank++, lr->second);
  }
}

void Tokenizer::Impl::loadAddedTokens(const Json& tokens) {
  if (tokens.is_null()) return;
  for (const Json& t : tokens) {
    AddedToken a;
    a.id = t.at("id").get<int32_t>();
    a.content = t.at("content").get<std::string>();
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.normalized = t.value("normalized", !a.special);
    if (a.content.empty()) continue;
    if (static_cast<size_t>(a.id) >= id_to_token.size())
      id_to_token.resize(static_cast<size_t>(a.id) + 1);
    id_to_token[static_cast<size_t>(a.id)] = a.content;
    vocab[a.content] = a.id;
    added.push_back(std::move(a));
  }
  id_is_special.assign(id_to_token.size(), 0);
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    if (a.special) id_is_special[static_cast<size_t>(a.id)] = 1;
    // The crate matches normalized tokens by their normalized spelling.
    if (a.normalized)
      normalized_trie.insert(normalizer.apply(a.content), i);
    else
      raw_trie.insert(a.content, i);
  }
}

void Tokenizer::Impl::loadPostProcessor(const Json& post) {
  if (post.is_null()) return;
  const std::string type = post.value("type", "");
  auto idOf = [&](const std::string& token) {
    auto it = vocab.find(token);
    if (it == vocab.end())
      throw Error(label + ": post_processor token \"" + token + "\" is not in the vocab",
                  "the tokenizer.json is damaged");
    return it->second;
  };
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    for (const Json& p : post.at("processors")) {
      std::vector<TemplateItem> before = std::move(single_template);
      single_template.clear();
      loadPostProcessor(p);
      if (single_template.empty()) single_template = std::move(before);
    }
  } else if (type == "TemplateProcessing") {
    const Json& specials = post.value("special_tokens", Json::object());
    for (const Json& item : post.at("single")) {
      TemplateItem t;
      if (item.contains("Sequence")) {
        t.is_sequence = true;
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].at("id").get<std::string>();
        if (specials.contains(name))
          t.ids = specials[name].at("ids").get<std::vector<int32_t>>();
        else
          t.ids = {idOf(name)};
      } else {
        throw Error(label + ": bad TemplateProcessing item " + item.dump(),
                    "the tokenizer.json is damaged");
      }
      single_template.push_back(std::move(t));
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    const int32_t cls = post.at("cls").at(1).get<int32_t>(),
                  sep = post.at("sep").at(1).get<int32_t>();
    single_template = {{false, {cls}}, {true, {}}, {false, {sep}}};
  } else {
    unsupported(label, "post_processor \"" + type + "\"");
  }
}

void Tokenizer::Impl::loadDecoder(const Json& decoder) {
  if (decoder.is_null()) return;
  has_decoder = true;
  const std::string type = decoder.value("type", "");
  if (type == "Sequence") {
    for (const Json& d : decoder.at("decoders")) loadDecoder(d);
  } else if (type == "ByteLevel") {
    decoders.push_back({DecodeStep::ByteLevel, {}, {}});
  } else if (type == "ByteFallback") {
    decoders.push_back({DecodeStep::ByteFallback, {}, {}});
  } else if (type == "Fuse") {
    decoders.push_back({DecodeStep::Fuse, {}, {}});
  } else if (type == "Strip") {
    decoders.push_back({DecodeStep::Strip,
                        {},
                        decoder.at("content").get<std::string>(),
                        decoder.value("start", size_t{0}),
                        decoder.value("stop", size_t{0})});
  } else if (type == "Replace" && decoder.at("pattern").contains("String")) {
    decoders.push_back({DecodeStep::Replace, decoder["pattern"]["String"].get<std::string>(),
                        decoder.at("content").get<std::string>()});
  } else {
    unsupported(label, "decoder \"" + type + "\"");
  }
}

void Tokenizer::Impl::applyConfig(const Json& config) {
  auto special = [&](const char* key) -> std::optional<int32_t> {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) return std::nullopt;
    const std::string content = it->is_object()   ? it->value("content", "")
                                : it->is_string() ? it->get<std::string>()
                                                  : "";
    auto v = vocab.find(content);
    if (v == vocab.end())
      throw Error("tokenizer_config.json: " + std::string(key) + " \"" + content +
                      "\" is not in the vocabulary",
                  "fix tokenizer_config.json or use the tokenizer.json that belongs to it");
    return v->second;
  };
  eos = special("eos_token");
  bos = special("bos_token");
  pad = special("pad_token");
  // transformers' LlamaTokenizerFast rebuilds the template from add_bos_token / add_eos_token.
  const bool has_flag = config.contains("add_bos_token") || config.contains("add_eos_token");
  const std::string cls = config.value("tokenizer_class", "");
  if (has_flag && (cls == "LlamaTokenizerFast" || cls == "LlamaTokenizer")) {
    single_template.clear();
    if (config.value("add_bos_token", true) && bos) single_template.push_back({false, {*bos}});
    single_template.push_back({true, {}});
    if (config.value("add_eos_token", false) && eos) single_template.push_back({false, {*eos}});
  }
}

Tokenizer Tokenizer::fromJson(std::string_view tokenizer_json, std::string_view config_json,
                              std::string_view label) {
  auto impl = std::make_shared<Impl>();
  impl->label = std::string(label);
  const Json root = parseJson(tokenizer_json, label);
  if (!root.is_object() || !root.contains("model"))
    throw Error(impl->label + " has no \"model\"", "is this a Hugging Face tokenizer.json?");
  try {
    impl->normalizer = Normalizer::fromJson(root.value("normalizer", Json()));
    impl->pre_tokenizer = PreTokenizer::fromJson(root.value("pre_tokenizer", Json()));
    impl->loadModel(root["model"]);
    impl->loadAddedTokens(root.value("added_tokens", Json()));
    impl->loadPostProcessor(root.value("post_processor", Json()));
    impl->loadDecoder(root.value("decoder", Json()));
    if (!config_json.empty()) impl->applyConfig(parseJson(config_json, "tokenizer_config.json"));
  } catch (const Json::exception& e) {
    throw Error(impl->label + ": unexpected structure: " + e.what(),
                "the tokenizer.json looks damaged; re-download it");
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  if (isGgufPath(path)) {
    const std::unique_ptr<GgufModel> gguf = GgufModel::open(path);
    return fromJson(gguf->tokenizerJson(), gguf->tokenizerConfigJson(),
                    gguf->path().string() + " (its tokenizer)");
  }
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path)) file = path / "tokenizer.json";
  if (!std::filesystem::exists(file)) {
    const bool sp = std::filesystem::exists(file.parent_path() / "tokenizer.model");
    throw Error(
        "no tokenizer.json at " + file.string(),
        sp ? "only tokenizer.model (SentencePiece) is there; convert it with transformers "
             "(AutoTokenizer.from_pretrained(dir).save_pretrained(dir)) to get tokenizer.json"
           : "pass a tokenizer.json file or the model directory that holds one");
  }
  const std::filesystem::path config = file.parent_path() / "tokenizer_config.json";
  const std::string config_text =
      std::filesystem::exists(config) ? readFile(config) : std::string();
  return fromJson(readFile(file), config_text, file.string());
}

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
