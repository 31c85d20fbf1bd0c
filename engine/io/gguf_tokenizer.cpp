// tokenizer.json + tokenizer_config.json from a GGUF file's `tokenizer.ggml.*` metadata.
//
// GGUF keeps the vocabulary (tokens, token_type, merges or scores) and names the pre-tokenizer
// (`tokenizer.ggml.pre`); the split regexes live in llama.cpp's code. Each pre name read here is
// turned back into the pre-tokenizer of the published tokenizer.json it was converted from, so
// Tandem encodes as the original Hugging Face tokenizer does (docs/gguf.md).
#include <algorithm>
#include <map>

#include "engine/core/error.h"
#include "engine/io/gguf_model_detail.h"

namespace tandem::io::gguf_detail {
namespace {

using Json = nlohmann::json;

// llama.cpp's llama_token_type values (tokenizer.ggml.token_type).
constexpr int64_t kTokenNormal = 1;
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
  return {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
}

Json byteLevel(bool add_prefix_space, bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", false},
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
            {{"type", "Sequence"}, {"pretokenizers", Json::array({split(kQwen2Pattern), byteLevel(false, false)})}}};
  }
  if (pre == "llama-bpe" || pre == "llama3") {
    return {nullptr,
            {{"type", "Sequence"}, {"pretokenizers", Json::array({split(kLlama3Pattern), byteLevel(false, false)})}},
            true};
  }
  if (pre == "deepseek-v3") {
    Json steps = Json::array();
    for (const char* p : kDeepseekV3Patterns) steps.push_back(split(p));
    steps.push_back(byteLevel(false, false));
    return {nullptr, {{"type", "Sequence"}, {"pretokenizers", steps}}};
  }
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2") return {nullptr, byteLevel(false, true)};
  throw Error(label + ": tokenizer.ggml.pre is '" + pre + "', a pre-tokenizer Tandem does not read",
              "Tandem reads GGUF tokenizers with tokenizer.ggml.pre qwen2 (Qwen2/2.5/3), llama-bpe (Llama-3), "
              "deepseek-v3 and default (GPT-2); use the Hugging Face model directory instead");
}

Json addedToken(int64_t id, const std::string& content, bool special) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", false}, {"special", special}};
}

std::optional<std::string> tokenAt(const GgufFile& file, const std::vector<std::string>& tokens, const char* key) {
  const std::optional<int64_t> id = file.optInt(key);
  if (!id) return std::nullopt;
  if (*id < 0 || *id >= static_cast<int64_t>(tokens.size())) {
    throw Error(file.path().string() + ": " + key + " is " + std::to_string(*id) + ", outside the " +
                    std::to_string(tokens.size()) + " tokens",
                "the file's tokenizer metadata is corrupt");
  }
  return tokens[static_cast<size_t>(*id)];
}

// The post-processor that adds BOS as the HF tokenizer did (llama.cpp's add_bos_token).
Json bosTemplate(const std::string& bos, int64_t bos_id) {
  const Json bos_piece = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  return {{"type", "TemplateProcessing"},
          {"single", Json::array({bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
          {"pair", Json::array({bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, bos_piece,
                                {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
          {"special_tokens", {{bos, {{"id", bos}, {"ids", Json::array({bos_id})}, {"tokens", Json::array({bos})}}}}}};
}

}  // namespace

HfTokenizerFiles hfTokenizer(const GgufFile& file) {
  const std::string label = file.path().string();
  const std::string model = file.getString("tokenizer.ggml.model");
  if (model != "gpt2") {
    throw Error(label + ": tokenizer.ggml.model is '" + model + "', which Tandem does not read yet",
                "Tandem reads GGUF byte-level BPE tokenizers (tokenizer.ggml.model gpt2: Qwen, DeepSeek, Llama-3); "
                "for SentencePiece models (llama: Llama-2, Mixtral) use the Hugging Face model directory");
  }
  const std::vector<std::string>& tokens = file.getStrings("tokenizer.ggml.tokens");
  const std::vector<std::string>& merges = file.getStrings("tokenizer.ggml.merges");
  std::vector<int64_t> types;
  if (file.find("tokenizer.ggml.token_type") != nullptr) {
    types = file.getInts("tokenizer.ggml.token_type");
    if (types.size() != tokens.size()) {
      throw Error(label + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " +
                      std::to_string(tokens.size()) + " tokens",
                  "the file's tokenizer metadata is corrupt");
    }
  }
  const PreTokenizer pre = preTokenizerFor(file.optString("tokenizer.ggml.pre").value_or("default"), label);

  Json vocab = Json::object();
  Json added = Json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const int64_t type = types.empty() ? kTokenNormal : types[id];
    if (type == kTokenControl || type == kTokenUserDefined) {
      added.push_back(addedToken(static_cast<int64_t>(id), tokens[id], type == kTokenControl));
    }
    if (vocab.contains(tokens[id])) {
      throw Error(label + ": token '" + tokens[id] + "' appears twice in tokenizer.ggml.tokens",
                  "the file's tokenizer metadata is corrupt");
    }
    vocab[tokens[id]] = id;
  }

  Json tokenizer = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
                    {"normalizer", pre.normalizer}, {"pre_tokenizer", pre.pre_tokenizer},
                    {"post_processor", nullptr},
                    {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                                 {"use_regex", true}}},
                    {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                               {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                               {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", pre.ignore_merges},
                               {"vocab", vocab}, {"merges", merges}}}};

  Json config = {{"tokenizer_class", "PreTrainedTokenizerFast"}};
  const std::optional<std::string> bos = tokenAt(file, tokens, "tokenizer.ggml.bos_token_id");
  const std::optional<std::string> eos = tokenAt(file, tokens, "tokenizer.ggml.eos_token_id");
  const std::optional<std::string> pad = tokenAt(file, tokens, "tokenizer.ggml.padding_token_id");
  if (bos) config["bos_token"] = *bos;
  if (eos) config["eos_token"] = *eos;
  if (pad) config["pad_token"] = *pad;
  // The converter writes add_bos_token from the HF tokenizer; llama.cpp's BPE default is false.
  const bool add_bos = file.optBool("tokenizer.ggml.add_bos_token").value_or(false);
  if (add_bos) {
    if (!bos) {
      throw Error(label + ": tokenizer.ggml.add_bos_token is true but there is no tokenizer.ggml.bos_token_id",
                  "the file's tokenizer metadata is corrupt");
    }
    tokenizer["post_processor"] = bosTemplate(*bos, file.getInt("tokenizer.ggml.bos_token_id"));
  }
  if (auto chat_template = file.optString("tokenizer.chat_template")) config["chat_template"] = *chat_template;
  return {std::move(tokenizer), std::move(config)};
}

}  // namespace tandem::io::gguf_detail
