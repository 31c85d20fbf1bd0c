// Reading a Hugging Face tokenizer.json (and tokenizer_config.json) into a Tokenizer. Every id
// and count in the file is checked against the file itself before anything is sized from it.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/io/bounded_json.h"
#include "engine/io/tokenizer.h"
#include "engine/io/tokenizer_impl.h"
#include "engine/io/tokenizer_pretokenize.h"

namespace tandem::io {
namespace {

using Json = nlohmann::json;
using namespace tokenizer_detail;

// No tokenizer has more ids than this (the largest published vocabularies have ~260k): a bound on
// what a file can make Tandem allocate, below the file's own count of tokens.
constexpr size_t kMaxTokenIds = size_t{1} << 24;
constexpr const char* kDamaged = "the tokenizer.json is damaged; re-download it";

// A value from the file, cut for an error message.
std::string shownValue(const Json& value) { return excerptForMessage(value.dump()); }
std::string shown(std::string_view text) { return "\"" + excerptForMessage(text) + "\""; }

// The key's value, or null: value(key, Json()) would copy it.
const Json& member(const Json& object, const char* key) {
  static const Json null_value;
  if (!object.is_object()) return null_value;
  const auto it = object.find(key);
  return it == object.end() ? null_value : *it;
}

const std::string& text(const Json& value, const std::string& where) {
  if (!value.is_string())
    throw Error(where + " must be a string, not " + shownValue(value), kDamaged);
  return value.get_ref<const std::string&>();
}

[[noreturn]] void unsupported(std::string_view label, std::string_view what) {
  throw Error(
      std::string(label) + ": " + std::string(what) + " is not supported",
      "Tandem reads BPE tokenizers (byte-level or with byte fallback); see docs/tokenizer.md");
}

// A count of the file (absent: 0). A float is refused: converting one past size_t is undefined.
size_t count(const Json& value, const std::string& where) {
  if (value.is_null()) return 0;
  if (!value.is_number_unsigned())
    throw Error(where + " must be a whole number, not " + shownValue(value), kDamaged);
  return value.get<size_t>();
}

}  // namespace

int32_t Tokenizer::Impl::readId(const Json& value, const std::string& where) const {
  if (!value.is_number_integer())
    throw Error(label + ": " + where + " has id " + shownValue(value) + ", not an integer",
                kDamaged);
  const bool in_range =
      value.is_number_unsigned()
          ? value.get<uint64_t>() < id_limit
          : value.get<int64_t>() >= 0 && static_cast<uint64_t>(value.get<int64_t>()) < id_limit;
  if (!in_range) {
    throw Error(label + ": " + where + " has id " + shownValue(value) + ", outside 0.." +
                    std::to_string(id_limit - 1) + " (the ids of the " + std::to_string(id_limit) +
                    " tokens the file holds)",
                kDamaged);
  }
  return static_cast<int32_t>(value.get<int64_t>());
}

int32_t Tokenizer::Impl::knownId(const Json& value, const std::string& where) const {
  const int32_t id = readId(value, where);
  if (static_cast<size_t>(id) >= id_to_token.size() || id_to_token[static_cast<size_t>(id)].empty())
    throw Error(label + ": " + where + " has id " + std::to_string(id) +
                    ", which no token of the vocab or added_tokens has",
                kDamaged);
  return id;
}

void Tokenizer::Impl::loadModel(const Json& model) {
  if (!model.is_object()) throw Error(label + ": \"model\" is not an object", kDamaged);
  const std::string type = model.value("type", std::string(model.contains("merges") ? "BPE" : ""));
  if (type != "BPE") unsupported(label, "model type " + shown(type) + " (only BPE)");
  if (!member(model, "continuing_subword_prefix").is_null() ||
      !member(model, "end_of_word_suffix").is_null())
    unsupported(label, "BPE continuing_subword_prefix / end_of_word_suffix");
  if (const Json& dropout = member(model, "dropout");
      !dropout.is_null() && (!dropout.is_number() || dropout.get<double>() != 0.0))
    unsupported(label, "BPE dropout");
  byte_fallback = model.value("byte_fallback", false);
  fuse_unk = model.value("fuse_unk", false);
  ignore_merges = model.value("ignore_merges", false);

  const Json& v = model.at("vocab");
  if (!v.is_object()) throw Error(label + ": model.vocab is not an object of token: id", kDamaged);
  vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    const int32_t id = readId(it.value(), "model.vocab entry " + shown(it.key()));
    vocab.emplace(it.key(), id);
    if (static_cast<size_t>(id) >= id_to_token.size())
      id_to_token.resize(static_cast<size_t>(id) + 1);
    id_to_token[static_cast<size_t>(id)] = it.key();
  }
  const Json& unk_token = member(model, "unk_token");
  const std::string unk = unk_token.is_string() ? unk_token.get<std::string>() : "";
  if (!unk.empty()) {
    auto it = vocab.find(unk);
    if (it == vocab.end())
      throw Error(label + ": unk_token " + shown(unk) + " is not in the vocab", kDamaged);
    unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab.find(name);
    byte_fallback_ids[b] = it == vocab.end() ? -1 : it->second;
  }

  const Json& m = model.at("merges");
  if (!m.is_array()) throw Error(label + ": model.merges is not a list", kDamaged);
  merges.reserve(m.size());
  int32_t rank = 0;
  for (const Json& merge : m) {
    std::string left, right;
    if (merge.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos) throw Error(label + ": bad merge " + shown(s), kDamaged);
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {  // ["a", "b"]
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      throw Error(label + ": bad merge entry " + shownValue(merge), kDamaged);
    }
    auto l = vocab.find(left), r = vocab.find(right), lr = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || lr == vocab.end())
      throw Error(
          label + ": merge " + shown(left + " " + right) + " uses tokens missing from the vocab",
          kDamaged);
    merges.try_emplace(pairKey(l->second, r->second), rank++, lr->second);
  }
}

void Tokenizer::Impl::loadAddedTokens(const Json& tokens) {
  if (tokens.is_null()) return;
  if (!tokens.is_array()) throw Error(label + ": added_tokens is not a list", kDamaged);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const Json& t = tokens[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) throw Error(label + ": " + where + " is not an object", kDamaged);
    AddedToken a;
    a.id = readId(member(t, "id"), where);
    a.content = text(member(t, "content"), label + ": " + where + ".content");
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
      throw Error(label + ": post_processor token " + shown(token) + " is not in the vocab",
                  kDamaged);
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
        if (specials.contains(name)) {
          const Json& ids = specials[name].at("ids");
          if (!ids.is_array())
            throw Error(label + ": post_processor special token " + shown(name) +
                            " has ids that are not a list",
                        kDamaged);
          for (const Json& id : ids)
            t.ids.push_back(knownId(id, "post_processor special token " + shown(name)));
        } else {
          t.ids = {idOf(name)};
        }
      } else {
        throw Error(label + ": bad TemplateProcessing item " + shownValue(item), kDamaged);
      }
      single_template.push_back(std::move(t));
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    const int32_t cls = knownId(post.at("cls").at(1), "post_processor cls"),
                  sep = knownId(post.at("sep").at(1), "post_processor sep");
    single_template = {{false, {cls}}, {true, {}}, {false, {sep}}};
  } else {
    unsupported(label, "post_processor " + shown(type));
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
                        count(member(decoder, "start"), label + ": Strip decoder start"),
                        count(member(decoder, "stop"), label + ": Strip decoder stop")});
  } else if (type == "Replace" && decoder.at("pattern").contains("String")) {
    decoders.push_back({DecodeStep::Replace, decoder["pattern"]["String"].get<std::string>(),
                        decoder.at("content").get<std::string>()});
  } else {
    unsupported(label, "decoder " + shown(type));
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
      throw Error("tokenizer_config.json: " + std::string(key) + " " + shown(content) +
                      " is not in the vocabulary",
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
  const Json root = parseBoundedJson(tokenizer_json, kTokenizerJsonLimits, label);
  if (!root.is_object() || !root.contains("model"))
    throw Error(impl->label + " has no \"model\"", "is this a Hugging Face tokenizer.json?");
  const Json config = config_json.empty() ? Json()
                                          : parseBoundedJson(config_json, kTokenizerJsonLimits,
                                                             "tokenizer_config.json");
  try {
    // Every id in the file is below the number of tokens it holds (vocab and added tokens).
    const Json& added_tokens = member(root, "added_tokens");
    impl->id_limit =
        std::min(kMaxTokenIds, member(root["model"], "vocab").size() +
                                   (added_tokens.is_array() ? added_tokens.size() : 0));
    impl->normalizer = Normalizer::fromJson(member(root, "normalizer"));
    impl->pre_tokenizer = PreTokenizer::fromJson(member(root, "pre_tokenizer"));
    impl->loadModel(root["model"]);
    impl->loadAddedTokens(added_tokens);
    impl->loadPostProcessor(member(root, "post_processor"));
    impl->loadDecoder(member(root, "decoder"));
    if (!config.is_null()) impl->applyConfig(config);
  } catch (const Json::exception& e) {
    throw Error(impl->label + ": unexpected structure: " + e.what(),
                "the tokenizer.json looks damaged; re-download it");
  }
  return Tokenizer(std::move(impl));
}

}  // namespace tandem::io
