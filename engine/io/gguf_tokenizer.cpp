// tokenizer.json + tokenizer_config.json from a GGUF file's `tokenizer.ggml.*` metadata.
//
// Byte-level BPE (`tokenizer.ggml.model` gpt2): GGUF keeps the vocabulary and merges and names the
// pre-tokenizer (`tokenizer.ggml.pre`); the split regexes live in llama.cpp's code. Each pre name
// read here is turned back into the pre-tokenizer of the published tokenizer.json it was converted
// from, so Tandem encodes as the original Hugging Face tokenizer does (docs/gguf.md).
//
// SentencePiece BPE (`llama`: Llama-2, Mistral, Mixtral): GGUF keeps the pieces in the model's
// order and no merges; they are rebuilt as transformers' LlamaConverter builds them from
// tokenizer.model (generate_merges), with byte fallback and the legacy "▁" normalizer it gives
// those models.
#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>

#include "engine/core/error.h"
#include "engine/io/bounded_json.h"
#include "engine/io/gguf_detail.h"
#include "engine/io/gguf_model_detail.h"

namespace tandem::io::gguf_detail {
namespace {

using Json = nlohmann::json;

// llama.cpp's llama_token_type values (tokenizer.ggml.token_type).
constexpr int64_t kTokenNormal = 1;
constexpr int64_t kTokenUnknown = 2;
constexpr int64_t kTokenControl = 3;
constexpr int64_t kTokenUserDefined = 4;

// The split regexes of the published tokenizer.json files of each family.
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kDeepseekV3Patterns[] = {
    R"(\p{N}{1,3})",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
};

Json split(const char* pattern) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", pattern}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

Json byteLevel(bool add_prefix_space, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", false},
          {"use_regex", use_regex}};
}

struct PreTokenizer {
  Json normalizer;
  Json pre_tokenizer;
  bool ignore_merges = false;
};

PreTokenizer preTokenizerFor(const std::string& pre, const std::string& label) {
  if (pre == "qwen2") {
    return {{{"type", "NFC"}},
            {{"type", "Sequence"},
             {"pretokenizers", Json::array({split(kQwen2Pattern), byteLevel(false, false)})}}};
  }
  if (pre == "llama-bpe" || pre == "llama3") {
    return {nullptr,
            {{"type", "Sequence"},
             {"pretokenizers", Json::array({split(kLlama3Pattern), byteLevel(false, false)})}},
            true};
  }
  if (pre == "deepseek-v3") {
    Json steps = Json::array();
    for (const char* p : kDeepseekV3Patterns) steps.push_back(split(p));
    steps.push_back(byteLevel(false, false));
    return {nullptr, {{"type", "Sequence"}, {"pretokenizers", steps}}};
  }
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2") return {nullptr, byteLevel(false, true)};
  throw Error(label + ": tokenizer.ggml.pre is '" + excerptForMessage(pre) +
                  "', a pre-tokenizer Tandem does not read",
              "Tandem reads GGUF tokenizers with tokenizer.ggml.pre qwen2 (Qwen2/2.5/3), llama-bpe "
              "(Llama-3), "
              "deepseek-v3 and default (GPT-2); use the Hugging Face model directory instead");
}

Json addedToken(int64_t id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

std::optional<std::string> tokenAt(const GgufFile& file, const std::vector<std::string>& tokens,
                                   const char* key) {
  const std::optional<int64_t> id = file.optInt(key);
  if (!id) return std::nullopt;
  if (*id < 0 || *id >= static_cast<int64_t>(tokens.size())) {
    throw Error(file.path().string() + ": " + key + " is " + std::to_string(*id) +
                    ", outside the " + std::to_string(tokens.size()) + " tokens",
                "the file's tokenizer metadata is corrupt");
  }
  return tokens[static_cast<size_t>(*id)];
}

// The post-processor that adds BOS as the HF tokenizer did (llama.cpp's add_bos_token).
Json bosTemplate(const std::string& bos, int64_t bos_id) {
  const Json bos_piece = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  return {{"type", "TemplateProcessing"},
          {"single", Json::array({bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
          {"pair", Json::array({bos_piece,
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                bos_piece,
                                {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
          {"special_tokens",
           {{bos, {{"id", bos}, {"ids", Json::array({bos_id})}, {"tokens", Json::array({bos})}}}}}};
}

// tokenizer.json is JSON text, which holds UTF-8 only (nlohmann's dump() throws on anything
// else): every string array taken from the file is checked, naming the entry.
const std::vector<std::string>& utf8Strings(const GgufFile& file, const char* key,
                                            const char* what) {
  const std::vector<std::string>& strings = file.getStrings(key);
  for (size_t i = 0; i < strings.size(); ++i) {
    if (!isValidUtf8(strings[i])) {
      throw Error(file.path().string() + ": " + key + " holds " + what + " " + std::to_string(i) +
                      ", which is not valid UTF-8",
                  "the file's tokenizer metadata is corrupt, or written by a converter that "
                  "Tandem does not read; use the Hugging Face model directory instead");
    }
  }
  return strings;
}

// tokenizer.ggml.token_type, one per token (all normal when the key is absent).
std::vector<int64_t> tokenTypes(const GgufFile& file, size_t n_tokens) {
  if (file.find("tokenizer.ggml.token_type") == nullptr)
    return std::vector<int64_t>(n_tokens, kTokenNormal);
  std::vector<int64_t> types = file.getInts("tokenizer.ggml.token_type");
  if (types.size() != n_tokens) {
    throw Error(file.path().string() + ": tokenizer.ggml.token_type has " +
                    std::to_string(types.size()) + " entries for " + std::to_string(n_tokens) +
                    " tokens",
                "the file's tokenizer metadata is corrupt");
  }
  return types;
}

// Which prefixes of `piece` are tokens: hits[k] is true when piece[0, k) is one. `sorted` holds the
// tokens in byte order. Each byte of the piece narrows the range of tokens that begin with the
// bytes so far, so a piece costs O(length * log tokens), however long it is (a 1 MB token took
// 105 s when every split was hashed afresh).
std::vector<bool> prefixHits(const std::vector<std::string_view>& sorted, std::string_view piece) {
  std::vector<bool> hits(piece.size() + 1, false);
  auto lo = sorted.begin(), hi = sorted.end();
  for (size_t k = 0; k < piece.size() && lo != hi; ++k) {
    // In [lo, hi) every token begins with piece[0, k); string_view orders them by their byte k
    // (unsigned), the one that is exactly piece[0, k) first.
    const int byte = static_cast<unsigned char>(piece[k]);
    auto byte_at = [k](std::string_view t) {
      return t.size() > k ? static_cast<int>(static_cast<unsigned char>(t[k])) : -1;
    };
    lo = std::partition_point(lo, hi, [&](std::string_view t) { return byte_at(t) < byte; });
    hi = std::partition_point(lo, hi, [&](std::string_view t) { return byte_at(t) <= byte; });
    if (lo != hi && lo->size() == k + 1) hits[k + 1] = true;
  }
  return hits;
}

// transformers' generate_merges(vocab) over the pieces in id order
// (SentencePieceExtractor.extract): every split of a piece into two pieces of the vocab is a merge;
// merges are ranked by the merged piece's id, then by the lengths of the left and right parts (code
// points), shorter first. Left parts are found among the tokens, right parts among the reversed
// tokens (a suffix of the piece is a prefix of the reversed piece).
Json sentencePieceMerges(const std::vector<std::string>& tokens) {
  std::vector<std::string> reversed(tokens.rbegin(), tokens.rend());
  for (std::string& t : reversed) std::reverse(t.begin(), t.end());
  std::vector<std::string_view> forward_sorted(tokens.begin(), tokens.end());
  std::vector<std::string_view> reversed_sorted(reversed.begin(), reversed.end());
  std::sort(forward_sorted.begin(), forward_sorted.end());
  std::sort(reversed_sorted.begin(), reversed_sorted.end());
  Json merges = Json::array();
  std::string backwards;
  for (const std::string& piece : tokens) {
    if (piece.size() < 2) continue;
    backwards.assign(piece.rbegin(), piece.rend());
    const std::vector<bool> left_is_token = prefixHits(forward_sorted, piece);
    const std::vector<bool> right_is_token = prefixHits(reversed_sorted, backwards);
    for (size_t cut = 1; cut < piece.size(); ++cut) {
      const bool code_point_boundary = (static_cast<unsigned char>(piece[cut]) & 0xC0) != 0x80;
      if (code_point_boundary && left_is_token[cut] && right_is_token[piece.size() - cut]) {
        merges.push_back(Json::array({piece.substr(0, cut), piece.substr(cut)}));
      }
    }
  }
  return merges;
}

Json vocabularyOf(const std::vector<std::string>& tokens) {
  Json vocab = Json::object();
  // A token that appears twice keeps its first id, as llama.cpp's token_to_id does.
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!vocab.contains(tokens[id])) vocab[tokens[id]] = id;
  }
  return vocab;
}

struct ModelPart {
  Json model, normalizer, pre_tokenizer, decoder;
  bool default_add_bos = false;  // llama.cpp's default when tokenizer.ggml.add_bos_token is absent
};

ModelPart byteLevelModel(const GgufFile& file, const std::vector<std::string>& tokens) {
  const PreTokenizer pre = preTokenizerFor(file.optString("tokenizer.ggml.pre").value_or("default"),
                                           file.path().string());
  return {{{"type", "BPE"},
           {"dropout", nullptr},
           {"unk_token", nullptr},
           {"continuing_subword_prefix", nullptr},
           {"end_of_word_suffix", nullptr},
           {"fuse_unk", false},
           {"byte_fallback", false},
           {"ignore_merges", pre.ignore_merges},
           {"vocab", vocabularyOf(tokens)},
           {"merges", utf8Strings(file, "tokenizer.ggml.merges", "merge")}},
          pre.normalizer,
          pre.pre_tokenizer,
          {{"type", "ByteLevel"},
           {"add_prefix_space", true},
           {"trim_offsets", true},
           {"use_regex", true}}};
}

ModelPart sentencePieceModel(const GgufFile& file, const std::vector<std::string>& tokens,
                             const std::vector<int64_t>& types) {
  const auto unk = std::find(types.begin(), types.end(), kTokenUnknown);
  const Json unk_token =
      unk == types.end() ? Json(nullptr) : Json(tokens[static_cast<size_t>(unk - types.begin())]);
  // Converters that went through tokenizer.json keep its merges; tokenizer.model has none.
  const Json merges = file.find("tokenizer.ggml.merges") != nullptr
                          ? Json(utf8Strings(file, "tokenizer.ggml.merges", "merge"))
                          : sentencePieceMerges(tokens);
  Json normalizer = Json::array();
  if (file.optBool("tokenizer.ggml.add_space_prefix").value_or(true)) {
    normalizer.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
  }
  normalizer.push_back(
      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
  const Json decoder = {
      {"type", "Sequence"},
      {"decoders",
       Json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  return {{{"type", "BPE"},
           {"dropout", nullptr},
           {"unk_token", unk_token},
           {"continuing_subword_prefix", nullptr},
           {"end_of_word_suffix", nullptr},
           {"fuse_unk", true},
           {"byte_fallback", true},
           {"ignore_merges", false},
           {"vocab", vocabularyOf(tokens)},
           {"merges", merges}},
          {{"type", "Sequence"}, {"normalizers", normalizer}},
          nullptr,
          decoder,
          true};
}

}  // namespace

HfTokenizerFiles hfTokenizer(const GgufFile& file) {
  const std::string label = file.path().string();
  const std::string model = file.getString("tokenizer.ggml.model");
  if (model != "gpt2" && model != "llama") {
    throw Error(label + ": tokenizer.ggml.model is '" + excerptForMessage(model) +
                    "', which Tandem does not read",
                "Tandem reads GGUF BPE tokenizers: byte-level (gpt2: Qwen, DeepSeek, Llama-3) and "
                "SentencePiece "
                "(llama: Llama-2, Mistral, Mixtral); use the Hugging Face model directory instead");
  }
  const std::vector<std::string>& tokens = utf8Strings(file, "tokenizer.ggml.tokens", "token");
  const std::vector<int64_t> types = tokenTypes(file, tokens.size());
  ModelPart part =
      model == "gpt2" ? byteLevelModel(file, tokens) : sentencePieceModel(file, tokens, types);

  Json added = Json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const int64_t type = types[id];
    if (type == kTokenControl || type == kTokenUserDefined ||
        (type == kTokenUnknown && model == "llama")) {
      added.push_back(addedToken(static_cast<int64_t>(id), tokens[id], type != kTokenUserDefined));
    }
  }
  Json tokenizer = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", added},
                    {"normalizer", part.normalizer},
                    {"pre_tokenizer", part.pre_tokenizer},
                    {"post_processor", nullptr},
                    {"decoder", part.decoder},
                    {"model", part.model}};

  Json config = {{"tokenizer_class", "PreTrainedTokenizerFast"}};
  const std::optional<std::string> bos = tokenAt(file, tokens, "tokenizer.ggml.bos_token_id");
  const std::optional<std::string> eos = tokenAt(file, tokens, "tokenizer.ggml.eos_token_id");
  const std::optional<std::string> pad = tokenAt(file, tokens, "tokenizer.ggml.padding_token_id");
  if (bos) config["bos_token"] = *bos;
  if (eos) config["eos_token"] = *eos;
  if (pad) config["pad_token"] = *pad;
  // The converter writes add_bos_token from the HF tokenizer; without it, llama.cpp's default.
  const bool add_bos = file.optBool("tokenizer.ggml.add_bos_token").value_or(part.default_add_bos);
  if (add_bos && bos)
    tokenizer["post_processor"] = bosTemplate(*bos, file.getInt("tokenizer.ggml.bos_token_id"));
  if (add_bos && !bos && file.find("tokenizer.ggml.add_bos_token") != nullptr) {
    throw Error(
        label +
            ": tokenizer.ggml.add_bos_token is true but there is no tokenizer.ggml.bos_token_id",
        "the file's tokenizer metadata is corrupt");
  }
  if (auto chat_template = file.optString("tokenizer.chat_template")) {
    if (!isValidUtf8(*chat_template)) {
      throw Error(label + ": tokenizer.chat_template is not valid UTF-8",
                  "the file's metadata is corrupt; use the Hugging Face model directory instead");
    }
    config["chat_template"] = *chat_template;
  }
  return {std::move(tokenizer), std::move(config)};
}

}  // namespace tandem::io::gguf_detail
