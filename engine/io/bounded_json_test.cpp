#include "engine/io/bounded_json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"

namespace tandem::io {
namespace {

std::string nested(char open, char close, int depth, std::string_view inner = "1") {
  return std::string(depth, open) + std::string(inner) + std::string(depth, close);
}

std::string errorOf(std::string_view text, JsonLimits limits) {
  try {
    parseBoundedJson(text, limits, "request body");
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(BoundedJson, AcceptsNestingUpToTheLimitAndRefusesOneMore) {
  const JsonLimits limits{8, 1 << 20};
  EXPECT_EQ(parseBoundedJson(nested('[', ']', 8), limits, "x").dump(), nested('[', ']', 8));
  EXPECT_NE(errorOf(nested('[', ']', 9), limits).find("nested more than 8 levels"),
            std::string::npos);
  // Objects count the same as arrays, mixed with them.
  std::string mixed;
  for (int i = 0; i < 9; ++i) mixed += "{\"a\":[";
  mixed += "0";
  for (int i = 0; i < 9; ++i) mixed += "]}";
  EXPECT_NE(errorOf(mixed, {12, 1 << 20}).find("nested more than 12"), std::string::npos);
  EXPECT_NO_THROW(parseBoundedJson(mixed, {18, 1 << 20}, "x"));
}

// The defect of issue 30: a body far deeper than any stack is refused, not crashed on. Without the
// limit, the dump() below would recurse a million frames deep.
TEST(BoundedJson, RefusesAMillionLevelsWithoutRecursing) {
  const std::string deep = nested('[', ']', 1'000'000);
  EXPECT_NE(errorOf(deep, kRequestJsonLimits).find("request body: JSON nested more than 64"),
            std::string::npos);
  EXPECT_FALSE(tryParseBoundedJson(deep, kRequestJsonLimits).has_value());
  const nlohmann::json ok = parseBoundedJson(nested('[', ']', 64), kRequestJsonLimits, "x");
  EXPECT_EQ(ok.dump().size(), 129u);
}

// Each kind's byte limit is spelled as a shift; one written in 32-bit arithmetic wrapped to 0 and
// refused every dataset file.
TEST(BoundedJson, EveryKindAcceptsAtLeastAMebibyte) {
  for (const JsonLimits& limits : {kRequestJsonLimits, kModelConfigJsonLimits, kTokenizerJsonLimits,
                                   kDatasetJsonLimits, kAdapterConfigJsonLimits, kStateJsonLimits,
                                   kTokenIdsJsonLimits, kSafetensorsIndexJsonLimits}) {
    EXPECT_GE(limits.max_bytes, size_t{1} << 20);
    EXPECT_GE(limits.max_depth, 8);
  }
  EXPECT_EQ(kDatasetJsonLimits.max_bytes, size_t{8} << 30);
}

TEST(BoundedJson, RefusesTextLargerThanTheLimitBeforeParsing) {
  const std::string message = errorOf(std::string(2000, ' ') + "1", {4, 1000});
  EXPECT_NE(message.find("larger than the 1000 B"), std::string::npos) << message;
}

TEST(BoundedJson, SaysWhyInvalidJsonIsInvalid) {
  const std::string message = errorOf("{\"a\": ", {4, 1000});
  EXPECT_NE(message.find("request body: not valid JSON"), std::string::npos) << message;
  EXPECT_FALSE(tryParseBoundedJson("{\"a\": ", {4, 1000}).has_value());
  EXPECT_EQ(tryParseBoundedJson("{\"a\": 2}", {4, 1000})->at("a"), 2);
}

TEST(BoundedJson, ExcerptCutsLongTextAtACharacterBoundary) {
  EXPECT_EQ(excerptForMessage("short"), "short");
  const std::string cut = excerptForMessage(std::string(3, 'a') + "é" + std::string(100, 'b'), 4);
  EXPECT_EQ(cut, "aaa… (105 bytes)");
}

}  // namespace
}  // namespace tandem::io
