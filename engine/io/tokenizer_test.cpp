#include "engine/io/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "engine/core/error.h"
#include "engine/io/tokenizer_pretokenize.h"

namespace tandem::io {
namespace {

// testdata/qwen2_small: a Qwen2-style tokenizer (NFC + Qwen2 split regex + ByteLevel, 700 tokens,
// "a b" merges, <|endoftext|> <|im_start|> <|im_end|> special, <tool_call> </tool_call> not)
// written by tests/parity/tokenizer_fixtures.py build_qwen2(vocab_size=700).
const std::filesystem::path kQwenDir =
    std::filesystem::path(TANDEM_IO_TESTDATA_DIR) / "qwen2_small";

std::string readText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const Tokenizer& qwen() {
  static const Tokenizer tokenizer = Tokenizer::load(kQwenDir);
  return tokenizer;
}

using Ids = std::vector<int32_t>;

TEST(Tokenizer, MatchesIdsFromTokenizersPackage) {
  // Expected ids computed with tokenizers 0.23.3 on the same file.
  EXPECT_EQ(qwen().encode("Hello world"), (Ids{39, 68, 75, 75, 78, 609, 274, 75, 67}));
  EXPECT_EQ(qwen().encode("I'M here, don't  go\n\n"),
            (Ids{40, 6, 44, 220, 347, 285, 11, 220, 388, 77, 6, 83, 220, 403, 78, 282}));
  EXPECT_EQ(qwen().encode("caf\u0065\u0301 日本語 😀👍🏽"),
            (Ids{66, 64, 69, 127, 102, 680, 245, 98, 162, 250, 105, 164, 103, 252, 276, 246, 222,
                 306, 121}));
  EXPECT_EQ(qwen().encode("12345"), (Ids{16, 17, 18, 19, 20}));
}

TEST(Tokenizer, NfcMakesComposedAndDecomposedFormsEqual) {
  EXPECT_EQ(qwen().encode("caf\u00e9"), qwen().encode("cafe\u0301"));
  EXPECT_EQ(tokenizer_detail::normalizeNfc("e\u0301\u0323"),
            "\u1eb9\u0301");  // ẹ́: reorder, compose
  EXPECT_EQ(tokenizer_detail::normalizeNfc("\u1100\u1161\u11a8"), "\uac01");  // Hangul LVT
  EXPECT_EQ(tokenizer_detail::normalizeNfd("\u00c5"), "A\u030a");
  EXPECT_EQ(tokenizer_detail::normalizeNfc("\u212b"), "\u00c5");  // singleton decomposition
}

TEST(Tokenizer, SpecialAndAddedTokensAreMatchedBeforeSplitting) {
  EXPECT_EQ(qwen().encode("<|im_start|>user\nhi<|im_end|>"),
            (Ids{701, 84, 82, 371, 198, 458, 702}));
  EXPECT_EQ(qwen().encode("<tool_call>x</tool_call>"), (Ids{703, 87, 704}));
  EXPECT_TRUE(qwen().isSpecial(702));
  EXPECT_FALSE(qwen().isSpecial(703));
  EXPECT_FALSE(qwen().isSpecial(39));
}

TEST(Tokenizer, ConfigGivesEosPadAndNoBos) {
  EXPECT_EQ(qwen().eosId(), 702);  // <|im_end|>
  EXPECT_EQ(qwen().padId(), 700);  // <|endoftext|>
  EXPECT_FALSE(qwen().bosId().has_value());
  EXPECT_EQ(qwen().vocabSize(), 705);
  EXPECT_EQ(qwen().tokenToId("<|im_end|>"), 702);
  EXPECT_FALSE(qwen().tokenToId("no such token").has_value());
  EXPECT_EQ(qwen().idToToken(220), "\u0120");  // byte-level space "Ġ"
  EXPECT_THROW(qwen().idToToken(100000), Error);
  EXPECT_THROW(qwen().idToToken(-1), Error);
}

TEST(Tokenizer, DecodeRoundTrips) {
  for (std::string_view s :
       {"Hello world", "  leading and trailing  ", "日本語のテキスト\n\tタブ",
        "👨‍👩‍👧‍👦 family, 👍🏿 ok", "x = [i * i for i in range(10)]\r\n",
        "Привет, мир! مرحبا", "<|im_start|>system\nYou are <tool_call>.<|im_end|>", ""}) {
    const Ids ids = qwen().encode(s);
    EXPECT_EQ(qwen().decode(ids), s) << s;
  }
  const Ids ids = qwen().encode("<|im_start|>hi<|im_end|>");
  EXPECT_EQ(qwen().decode(ids, /*skip_special_tokens=*/true), "hi");
  EXPECT_THROW(qwen().decode(Ids{99999}), Error);
}

TEST(Tokenizer, DecodeOfPartialUtf8GivesReplacementCharacter) {
  const Ids ids = qwen().encode("😀");
  ASSERT_GT(ids.size(), 1u);
  EXPECT_EQ(qwen().decode(std::span(ids).first(1)), "\ufffd");
  EXPECT_EQ(tokenizer_detail::utf8Lossy("a\xF0\x9F\x98z\xFF"), "a\ufffdz\ufffd");
}

TEST(Tokenizer, ArrayAndStringMergesGiveTheSameIds) {
  nlohmann::json j = nlohmann::json::parse(readText(kQwenDir / "tokenizer.json"));
  ASSERT_TRUE(j["model"]["merges"][0].is_string());
  for (auto& merge : j["model"]["merges"]) {
    const std::string s = merge.get<std::string>();
    const size_t space = s.find(' ');
    merge = nlohmann::json::array({s.substr(0, space), s.substr(space + 1)});
  }
  const Tokenizer arrays = Tokenizer::fromJson(j.dump());
  for (std::string_view s : {"Hello world", "don't stop 123", "日本語"})
    EXPECT_EQ(arrays.encode(s), qwen().encode(s));
  EXPECT_FALSE(arrays.eosId().has_value());  // no tokenizer_config.json given
}

TEST(Tokenizer, EncodeIsThreadSafe) {
  const std::string text = "The quick brown fox jumps over the lazy dog 0123456789 日本語";
  const Ids expected = qwen().encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i)
        ok[t] += qwen().encode(text + std::to_string(i % 7)).size() > expected.size();
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 200);
}

// A hand-written SentencePiece-style BPE (Llama-2 layout): byte fallback, template with <s>.
constexpr std::string_view kSentencePieceJson = R"({
  "added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true}],
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                 {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
                     "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
  "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
              {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
            "vocab": {"<unk>": 0, "<s>": 1, "<0xC3>": 2, "<0xA9>": 3, "▁": 4, "h": 5, "i": 6, "hi": 7, "▁hi": 8},
            "merges": [["h", "i"], ["▁", "hi"]]}
})";

TEST(Tokenizer, SentencePieceByteFallbackAndTemplate) {
  const Tokenizer t = Tokenizer::fromJson(kSentencePieceJson);
  EXPECT_EQ(t.encode("hi hi"), (Ids{8, 8}));
  EXPECT_EQ(t.encode("hi", /*add_special_tokens=*/true), (Ids{1, 8}));
  EXPECT_EQ(t.encode("hé"), (Ids{4, 5, 2, 3}));  // é is not in the vocab: its bytes
  EXPECT_EQ(t.encode("hxy"), (Ids{4, 5, 0}));    // no byte tokens for x, y: one fused <unk>
  EXPECT_EQ(t.decode(Ids{1, 8, 4, 5, 2, 3}), "<s> hi hé");
  EXPECT_EQ(t.decode(Ids{8, 2}), "hi\ufffd");
}

TEST(Tokenizer, LoadErrorsSayWhatIsWrong) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { Tokenizer::load("/nonexistent/dir"); }).find("no tokenizer.json"),
            std::string::npos);
  EXPECT_NE(message([] { Tokenizer::fromJson("{not json"); }).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(message([] {
              Tokenizer::fromJson(R"({"model": {"type": "WordPiece", "vocab": {}}})");
            }).find("WordPiece"),
            std::string::npos);
  EXPECT_NE(message([] {
              Tokenizer::fromJson(R"({"model": {"type": "Unigram", "vocab": []}})");
            }).find("Unigram"),
            std::string::npos);
  EXPECT_NE(message([] {
              Tokenizer::fromJson(
                  R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"},
                  "behavior": "Isolated"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
            }).find("regex does not compile"),
            std::string::npos);
  EXPECT_NE(
      message([] {
        Tokenizer::fromJson(
            R"({"pre_tokenizer": {"type": "Metaspace"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
      }).find("pre-tokenizer \"Metaspace\" is not supported"),
      std::string::npos);
  EXPECT_NE(
      message([] {
        Tokenizer::fromJson(
            R"({"normalizer": {"type": "NFKC"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
      }).find("normalizer \"NFKC\""),
      std::string::npos);
  EXPECT_NE(message([] { qwen().encode("bad \xC3\x28 utf8"); }).find("not valid UTF-8"),
            std::string::npos);
}

TEST(Tokenizer, PatternTranslationMatchesOniguruma) {
  using tokenizer_detail::Regex;
  // U+180E is not White_Space for Oniguruma (PCRE2 \s would match it); U+0085 is.
  const Regex space(R"(\s+)", "test");
  EXPECT_TRUE(space.findAll("\u180e").empty());
  EXPECT_EQ(space.findAll("a\u0085b").size(), 1u);
  // U+1FAAD (Unicode 15 emoji) is \p{S} for Oniguruma, unassigned for PCRE2 10.42.
  const Regex symbol(R"(\p{S})", "test");
  EXPECT_EQ(symbol.findAll("\U0001FAAD").size(), 1u);
  // Oniguruma's find_iter: empty matches split between characters.
  EXPECT_EQ(Regex("x*", "test").findAll("ab").size(), 3u);
}

}  // namespace
}  // namespace tandem::io
