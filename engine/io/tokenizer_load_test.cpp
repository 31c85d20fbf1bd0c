// Hostile tokenizer.json files: every one is refused with an Error naming what is wrong, never a
// crash, an out-of-bounds write or an allocation sized by a number in the file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/error.h"
#include "engine/io/tokenizer.h"

namespace tandem::io {
namespace {

using Json = nlohmann::json;

// A working byte-level-free BPE: a, b, ab and one added special token.
Json smallTokenizer() {
  return Json::parse(R"({
    "added_tokens": [{"id": 3, "content": "<s>", "special": true}],
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}
  })");
}

std::string loadError(const std::string& tokenizer_json, const std::string& config_json = {}) {
  try {
    Tokenizer::fromJson(tokenizer_json, config_json, "tokenizer.json");
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

std::string nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(TokenizerLoad, SmallTokenizerLoads) {
  const Tokenizer t = Tokenizer::fromJson(smallTokenizer().dump());
  EXPECT_EQ(t.encode("ab<s>"), (std::vector<int32_t>{2, 3}));
}

TEST(TokenizerLoad, DeeplyNestedValuesAreRefusedAtParse) {
  // A value 100k levels deep parses, then overflows the stack when copied (value(key, Json())).
  const std::string deep_normalizer =
      R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "normalizer": )" + nested(100000) +
      "}";
  EXPECT_NE(loadError(deep_normalizer).find("nested more than"), std::string::npos);
  EXPECT_NE(loadError(smallTokenizer().dump(), R"({"eos_token": )" + nested(100000) + "}")
                .find("nested more than"),
            std::string::npos);
}

TEST(TokenizerLoad, AddedTokenIdsAreRangeChecked) {
  Json negative = smallTokenizer();
  negative["added_tokens"][0]["id"] = -1;  // wrote before the start of a heap buffer
  EXPECT_NE(loadError(negative.dump()).find("added_tokens[0]"), std::string::npos);
  Json huge = smallTokenizer();
  huge["added_tokens"][0]["id"] = 2147483647;  // allocated ~64 GB of empty strings
  const std::string message = loadError(huge.dump());
  EXPECT_NE(message.find("added_tokens[0]"), std::string::npos) << message;
  EXPECT_NE(message.find("2147483647"), std::string::npos) << message;
  Json text_id = smallTokenizer();
  text_id["added_tokens"][0]["id"] = "3";
  EXPECT_NE(loadError(text_id.dump()).find("added_tokens[0]"), std::string::npos);
  Json content = smallTokenizer();
  content["added_tokens"][0]["content"] = Json::array({1, 2});
  EXPECT_NE(loadError(content.dump()).find("added_tokens[0]"), std::string::npos);
}

TEST(TokenizerLoad, VocabIdsAreRangeChecked) {
  Json huge = smallTokenizer();
  huge["model"]["vocab"]["b"] = 2000000000;
  std::string message = loadError(huge.dump());
  EXPECT_NE(message.find("vocab"), std::string::npos) << message;
  EXPECT_NE(message.find("\"b\""), std::string::npos) << message;
  Json fractional = smallTokenizer();
  fractional["model"]["vocab"]["b"] = 1e300;  // a float-to-int conversion out of range is UB
  message = loadError(fractional.dump());
  EXPECT_NE(message.find("\"b\""), std::string::npos) << message;
  Json negative = smallTokenizer();
  negative["model"]["vocab"]["b"] = -5;
  EXPECT_NE(loadError(negative.dump()).find("\"b\""), std::string::npos);
}

TEST(TokenizerLoad, PostProcessorIdsMustBeTokensOfTheFile) {
  Json roberta = smallTokenizer();
  roberta["post_processor"] = {
      {"type", "RobertaProcessing"}, {"cls", {"<s>", 3}}, {"sep", {"</s>", 99999}}};
  EXPECT_NE(loadError(roberta.dump()).find("99999"), std::string::npos);
  Json templ = smallTokenizer();
  templ["post_processor"] = Json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A"}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [3, -7], "tokens": ["<s>"]}}})");
  const std::string message = loadError(templ.dump());
  EXPECT_NE(message.find("-7"), std::string::npos) << message;
  EXPECT_NE(message.find("post_processor"), std::string::npos) << message;
}

TEST(TokenizerLoad, MessagesQuoteAtMostAnExcerpt) {
  Json t = smallTokenizer();
  t["model"]["merges"] = Json::array({Json::array({"a", "b", std::string(100000, 'x')})});
  const std::string message = loadError(t.dump());
  EXPECT_NE(message.find("merge"), std::string::npos) << message;
  EXPECT_LT(message.size(), 1000u);
  Json type = smallTokenizer();
  type["normalizer"] = {{"type", std::string(100000, 'N')}};
  EXPECT_LT(loadError(type.dump()).size(), 1000u);
}

TEST(TokenizerLoad, StripCountsAreWholeNumbers) {
  Json t = smallTokenizer();
  t["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 1e300}, {"stop", 0}};
  EXPECT_NE(loadError(t.dump()).find("Strip decoder start"), std::string::npos);
  t["decoder"]["start"] = 1;
  EXPECT_EQ(loadError(t.dump()), "no error");
}

}  // namespace
}  // namespace tandem::io
