#include "engine/hub/hub_repo.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "engine/core/error.h"
#include "engine/hub/hub_download.h"

namespace tandem::hub {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> paths(const std::vector<HubFile>& files) {
  std::vector<std::string> out;
  for (const HubFile& f : files) out.push_back(f.path);
  return out;
}

TEST(HubRepo, IncludePatternsAreFnmatchGlobs) {
  const std::vector<HubFile> files = {{"config.json"},
                                      {"model-00001-of-00002.safetensors"},
                                      {"model-00002-of-00002.safetensors"},
                                      {"Q4_K_M/model-Q4_K_M-00001-of-00002.gguf"},
                                      {"model-Q8_0.gguf"},
                                      {"tokenizer.json"}};
  EXPECT_EQ(paths(selectFiles(files, {})).size(), files.size());
  EXPECT_EQ(
      paths(selectFiles(files, {"*.gguf"})),
      (std::vector<std::string>{"Q4_K_M/model-Q4_K_M-00001-of-00002.gguf", "model-Q8_0.gguf"}));
  EXPECT_EQ(paths(selectFiles(files, {"*Q4_K_M*", "*.json"})),
            (std::vector<std::string>{"config.json", "Q4_K_M/model-Q4_K_M-00001-of-00002.gguf",
                                      "tokenizer.json"}));
  EXPECT_EQ(paths(selectFiles(files, {"model-0000[2-9]-of-?????.safetensors"})),
            (std::vector<std::string>{"model-00002-of-00002.safetensors"}));
  EXPECT_EQ(paths(selectFiles(files, {"[!m]*.json"})),
            (std::vector<std::string>{"config.json", "tokenizer.json"}));
  EXPECT_TRUE(selectFiles(files, {"*.bin"}).empty());
}

TEST(HubRepo, RepoIdsAndTheCacheLayout) {
  EXPECT_NO_THROW(checkRepoId("Qwen/Qwen3-30B-A3B"));
  for (const char* bad : {"Qwen3", "a/b/c", "../etc", "a/..", "a b/c", "/x", "x/"})
    EXPECT_THROW(checkRepoId(bad), Error) << bad;
  HubSettings s;
  s.home = "/h";
  EXPECT_EQ(repoCacheDir(s, "unsloth/Qwen3-30B-A3B-GGUF"),
            fs::path("/h/hub/models--unsloth--Qwen3-30B-A3B-GGUF"));
}

// Digests against well-known values: sha256("hello\n") and git's blob id of the same bytes
// (`echo hello | git hash-object --stdin`).
TEST(HubRepo, FileDigestsAreSha256AndGitBlobIds) {
  const fs::path file = fs::temp_directory_path() / "tandem_hub_digest_test.txt";
  std::FILE* out = std::fopen(file.string().c_str(), "wb");
  ASSERT_NE(out, nullptr);
  std::fputs("hello\n", out);
  std::fclose(out);
  EXPECT_EQ(fileSha256(file), "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03");
  EXPECT_EQ(fileGitBlobSha1(file), "ce013625030ba8dba906f756967f9e9ca394464a");
  fs::remove(file);
}

}  // namespace
}  // namespace tandem::hub
