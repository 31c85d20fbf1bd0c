#include "engine/eval/choice_answer.h"

#include <gtest/gtest.h>

namespace tandem::eval {
namespace {

TEST(ChoiceAnswer, FindsTheLetter) {
  EXPECT_EQ(extractChoice(" B\n", "ABCD"), 'B');
  EXPECT_EQ(extractChoice("C. Paris", "ABCD"), 'C');
  EXPECT_EQ(extractChoice("D：因为", "ABCD"), 'D');
  EXPECT_EQ(extractChoice("The answer is A.", "ABCD"), 'A');
  EXPECT_EQ(extractChoice("答案是B", "ABCD"), 'B');
  EXPECT_EQ(extractChoice("I think (C), not D? no: (C)", "ABCD"), 'C');
}

TEST(ChoiceAnswer, IgnoresLettersInsideWords) {
  EXPECT_EQ(extractChoice("Absolutely", "ABCD"), std::nullopt);
  EXPECT_EQ(extractChoice("a dog", "ABCD"), std::nullopt);  // case-sensitive
  EXPECT_EQ(extractChoice("", "ABCD"), std::nullopt);
  EXPECT_EQ(extractChoice("E", "ABCD"), std::nullopt);
  EXPECT_EQ(extractChoice("E", "ABCDE"), 'E');
}

}  // namespace
}  // namespace tandem::eval
