// Reading a Hugging Face tokenizer.json (and tokenizer_config.json) into a Tokenizer. Every id
// and count in the file is checked against the file itself before anything is sized from it.
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

}  // namespace tandem::io
