#include "engine/core/units.h"

#include <gtest/gtest.h>

#include <vector>

namespace tandem {
namespace {

TEST(Units, Bytes) {
  EXPECT_EQ(formatBytes(0), "0 B");
  EXPECT_EQ(formatBytes(1023), "1023 B");
  EXPECT_EQ(formatBytes(1536), "1.50 KiB");
  EXPECT_EQ(formatBytes(uint64_t{24} << 30), "24.0 GiB");
  EXPECT_EQ(formatBytes(uint64_t{512} << 30), "512 GiB");
}

TEST(Units, Counts) {
  EXPECT_EQ(formatCount(950), "950");
  EXPECT_EQ(formatCount(12300), "12.3 K");
  EXPECT_EQ(formatCount(30'532'122'624ull), "30.5 B");
  EXPECT_EQ(formatCount(671'000'000'000ull), "671 B");
}

TEST(Units, DurationsAndShapes) {
  EXPECT_EQ(formatDuration(0), "0:00:00");
  EXPECT_EQ(formatDuration(65.4), "0:01:05");
  EXPECT_EQ(formatDuration(3 * 3600 + 7), "3:00:07");
  EXPECT_EQ(formatShape(std::vector<int64_t>{}), "[]");
  EXPECT_EQ(formatShape(std::vector<int64_t>{2, 3}), "[2, 3]");
}

}  // namespace
}  // namespace tandem
