#include "engine/train/tokenized_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

namespace tandem::train {
namespace {

TEST(TokenizedCache, RoundTripsAndRejectsDamage) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("tandem_tok_cache_" + std::to_string(::getpid()));
  const auto file = dir / "x.bin";
  std::vector<chat::EncodedSample> samples = {{{1, 2, 3}, {-100, 2, 3}}, {{}, {}}, {{7}, {7}}};
  writeTokenizedCache(file, samples);
  const auto back = readTokenizedCache(file);
  ASSERT_TRUE(back.has_value());
  ASSERT_EQ(back->size(), 3u);
  EXPECT_EQ((*back)[0].input_ids, samples[0].input_ids);
  EXPECT_EQ((*back)[0].labels, samples[0].labels);
  EXPECT_EQ((*back)[2].labels, samples[2].labels);
  // Truncated or foreign files are not trusted.
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 3);
  EXPECT_FALSE(readTokenizedCache(file).has_value());
  std::ofstream(file) << "not a cache";
  EXPECT_FALSE(readTokenizedCache(file).has_value());
  EXPECT_FALSE(readTokenizedCache(dir / "missing.bin").has_value());
  std::filesystem::remove_all(dir);
}

TEST(TokenizedCache, KeyDependsOnContentAndSettings) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("tandem_tok_key_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a.json") << "[1]";
  const std::string k1 = tokenizedCacheKey({dir / "a.json"}, "cutoff=128");
  EXPECT_EQ(k1, tokenizedCacheKey({dir / "a.json"}, "cutoff=128"));
  EXPECT_NE(k1, tokenizedCacheKey({dir / "a.json"}, "cutoff=256"));
  std::ofstream(dir / "a.json") << "[2]";
  EXPECT_NE(k1, tokenizedCacheKey({dir / "a.json"}, "cutoff=128"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::train
