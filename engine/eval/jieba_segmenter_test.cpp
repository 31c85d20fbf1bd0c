#include "engine/eval/jieba_segmenter.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace tandem::eval {
namespace {

using Words = std::vector<std::string>;

const JiebaSegmenter& jieba() { return JiebaSegmenter::shared(TANDEM_JIEBA_DIR); }

// Expected cuts are list(jieba.cut(text)) from jieba 0.42.1 (tests/eval compares many more).
TEST(JiebaSegmenter, CutsLikeJieba) {
  EXPECT_EQ(jieba().cut(std::string_view("我来到北京清华大学")),
            (Words{"我", "来到", "北京", "清华大学"}));
  EXPECT_EQ(jieba().cut(std::string_view("永和服装饰品有限公司")),
            (Words{"永和", "服装", "饰品", "有限公司"}));
  EXPECT_EQ(jieba().cut(std::string_view("小明硕士毕业于中国科学院计算所，后在日本京都大学深造")),
            (Words{"小明", "硕士", "毕业", "于", "中国科学院", "计算所", "，", "后", "在",
                   "日本京都大学", "深造"}));
}

TEST(JiebaSegmenter, UnknownWordsGoThroughTheHmm) {
  // 杭研 is not in the dictionary: the HMM joins it.
  EXPECT_EQ(jieba().cut(std::string_view("他来到了网易杭研大厦")),
            (Words{"他", "来到", "了", "网易", "杭研", "大厦"}));
}

TEST(JiebaSegmenter, KeepsSpacesAndSplitsPunctuation) {
  EXPECT_EQ(jieba().cut(std::string_view("Hello, world! 3.14% 你好\r\n世界")),
            (Words{"Hello", ",", " ", "world", "!", " ", "3.14%", " ", "你好", "\r\n", "世界"}));
  EXPECT_TRUE(jieba().cut(std::string_view("")).empty());
  EXPECT_EQ(jieba().cut(std::string_view("  ")), (Words{" ", " "}));
}

TEST(JiebaSegmenter, MissingTablesAreAnError) {
  EXPECT_THROW(JiebaSegmenter::load("/nonexistent/jieba"), Error);
}

}  // namespace
}  // namespace tandem::eval
