#include "engine/eval/python_semantics.h"

#include <gtest/gtest.h>

#include <vector>

namespace tandem::eval::py {
namespace {

TEST(PythonSemantics, Utf8RoundTripsAndReplacesMalformedBytes) {
  const std::string text = "a\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80";  // a é 你 😀
  const std::u32string decoded = decodeUtf8(text);
  EXPECT_EQ(decoded, U"a\u00E9\u4F60\U0001F600");
  EXPECT_EQ(encodeUtf8(decoded), text);
  EXPECT_EQ(decodeUtf8("x\xE4\xBDy"), U"x\uFFFDy");  // cut-off sequence: one U+FFFD
  EXPECT_EQ(decodeUtf8("\xF0\x9F\x98"), U"\uFFFD");
  EXPECT_EQ(decodeUtf8("\xC0\xAF"), U"\uFFFD\uFFFD");            // overlong
  EXPECT_EQ(decodeUtf8("\xED\xA0\x80"), U"\uFFFD\uFFFD\uFFFD");  // surrogate
}

TEST(PythonSemantics, WhitespaceIsPythonsIsspace) {
  for (char32_t c :
       {U'\t', U'\n', U'\x0B', U'\x0C', U'\r', U'\x1C', U'\x1F', U' ', U'\x85', U'\xA0', U'\u1680',
        U'\u2000', U'\u200A', U'\u2028', U'\u2029', U'\u202F', U'\u205F', U'\u3000'}) {
    EXPECT_TRUE(isSpace(c)) << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'a', U'\x1B', U'\x84', U'\u200B', U'\uFEFF', U'\u3001'}) {
    EXPECT_FALSE(isSpace(c)) << static_cast<uint32_t>(c);
  }
  EXPECT_EQ(splitWhitespace(U"  a\u3000b\t\tc \n"),
            (std::vector<std::u32string>{U"a", U"b", U"c"}));
  EXPECT_TRUE(splitWhitespace(U" \r\n ").empty());
  EXPECT_EQ(rstripWhitespace(U" a b \u2028\n"), U" a b");
}

TEST(PythonSemantics, FsumIsCorrectlyRounded) {
  const std::vector<double> tenths(10, 0.1);
  EXPECT_EQ(fsum(tenths), 1.0);  // the plain sum is 0.9999999999999999
  const std::vector<double> half_even = {1e-16, 1.0, 1e16};
  EXPECT_EQ(fsum(half_even), 1.0000000000000002e16);
  EXPECT_EQ(fsum(std::vector<double>{}), 0.0);
  const std::vector<double> cancel = {1e100, 1.0, -1e100};
  EXPECT_EQ(fsum(cancel), 1.0);
}

TEST(PythonSemantics, NumpyMeanSumsPairwise) {
  // 0.1 summed 1000 times: pairwise summation gives a different last bit than a running sum.
  const std::vector<double> values(1000, 0.1);
  double running = 0;
  for (double v : values) running += v;
  const double mean = numpyMean(values);
  EXPECT_EQ(mean, 0.10000000000000002);  // np.mean([0.1] * 1000)
  EXPECT_EQ(running / 1000, 0.09999999999999859);
  EXPECT_EQ(numpyMean(std::vector<double>{1, 2, 4}), 7.0 / 3.0);
}

TEST(PythonSemantics, RoundIsDecimalHalfEven) {
  EXPECT_EQ(roundDecimal(2.675, 2), 2.67);  // 2.675 is 2.67499999... in binary
  EXPECT_EQ(roundDecimal(12.34565, 4), 12.3456);
  EXPECT_EQ(roundDecimal(0.5, 0), 0.0);
  EXPECT_EQ(roundDecimal(1.5, 0), 2.0);
  EXPECT_EQ(roundDecimal(78.39204411491599, 4), 78.392);
}

}  // namespace
}  // namespace tandem::eval::py
