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

chat::Conversation conversation(const std::string& answer) {
  chat::Conversation c;
  c.messages = {{chat::Role::User, "Who are you?"}, {chat::Role::Assistant, answer}};
  return c;
}

// The key follows what the tokens are made of: a changed response (as a changed response column
// in dataset_info.json gives), system, role or tokenizer_config.json is a miss.
TEST(TokenizedCache, KeyDependsOnTheConversationsTokenizerFilesAndSettings) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("tandem_tok_key_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << "{}";
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "a"})";
  const std::vector<std::filesystem::path> files = {dir / "tokenizer.json",
                                                    dir / "tokenizer_config.json"};
  const std::vector<chat::Conversation> data = {conversation("I am Tandem.")};
  const std::string k1 = tokenizedCacheKey(data, files, "cutoff=128");
  EXPECT_EQ(k1, tokenizedCacheKey(data, files, "cutoff=128"));
  EXPECT_NE(k1, tokenizedCacheKey(data, files, "cutoff=256"));
  EXPECT_NE(k1, tokenizedCacheKey({conversation("I am someone else.")}, files, "cutoff=128"));
  std::vector<chat::Conversation> with_system = data;
  with_system[0].system = "Be brief.";
  EXPECT_NE(k1, tokenizedCacheKey(with_system, files, "cutoff=128"));
  std::vector<chat::Conversation> roles = data;
  roles[0].messages[0].role = chat::Role::Observation;
  EXPECT_NE(k1, tokenizedCacheKey(roles, files, "cutoff=128"));
  // Where a sample came from is not what it is.
  std::vector<chat::Conversation> moved = data;
  moved[0].source.line = 99;
  EXPECT_EQ(k1, tokenizedCacheKey(moved, files, "cutoff=128"));
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "b"})";
  EXPECT_NE(k1, tokenizedCacheKey(data, files, "cutoff=128"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::train
