#include "engine/core/units.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tandem
