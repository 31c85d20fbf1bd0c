#pragma once
// Internal to tandem_io: the state of a Tokenizer, shared by reading a tokenizer.json
// (tokenizer_load.cpp) and encoding / decoding with it (tokenizer.cpp).

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/io/tokenizer.h"
#include "engine/io/tokenizer_pretokenize.h"

namespace tandem::io {
namespace tokenizer_detail {

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

}  // namespace tokenizer_detail

struct Tokenizer::Impl {
  using Json = nlohmann::json;
  using AddedToken = tokenizer_detail::AddedToken;
  using TokenTrie = tokenizer_detail::TokenTrie;
  using Segment = tokenizer_detail::Segment;
  using Decoder = tokenizer_detail::Decoder;
  using TemplateItem = tokenizer_detail::TemplateItem;
  using Normalizer = tokenizer_detail::Normalizer;
  using PreTokenizer = tokenizer_detail::PreTokenizer;
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

  size_t id_limit = 0;  // every id in the file is below this: its count of tokens, bounded

  // An id of the file (`where` names the entry): an integer in [0, id_limit), or an Error.
  int32_t readId(const Json& value, const std::string& where) const;
  // The same, and a token of the vocab or added_tokens has it.
  int32_t knownId(const Json& value, const std::string& where) const;
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

}  // namespace tandem::io
