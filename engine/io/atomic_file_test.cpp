// Tests for the file primitives under the safetensors code: atomic writes and read-only mapping.

#include "engine/io/atomic_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "engine/core/error.h"
#include "engine/core/platform/process_info.h"
#include "engine/io/mapped_file.h"

namespace tandem::io {
namespace {

namespace fs = std::filesystem;

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem_file_test_" + std::to_string(platform::currentProcessId()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string readAll(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  size_t entriesInDir() const {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(dir_), fs::directory_iterator()));
  }

  fs::path dir_;
};

TEST_F(FileTest, AtomicWriteCreatesAndReplaces) {
  const fs::path target = dir_ / "config.json";
  writeFileAtomically(target, std::string_view("first"));
  EXPECT_EQ(readAll(target), "first");
  writeFileAtomically(target, std::string_view("second, longer content"));
  EXPECT_EQ(readAll(target), "second, longer content");
  writeFileAtomically(target, [](std::FILE* out) { std::fputs("from callback", out); });
  EXPECT_EQ(readAll(target), "from callback");
  EXPECT_EQ(entriesInDir(), 1u) << "no temp file may be left behind";
}

TEST_F(FileTest, AtomicWriteEmptyContent) {
  const fs::path target = dir_ / "empty";
  writeFileAtomically(target, std::string_view());
  EXPECT_TRUE(fs::exists(target));
  EXPECT_EQ(fs::file_size(target), 0u);
}

TEST_F(FileTest, ThrowingWriterLeavesOldFileAndNoTemp) {
  const fs::path target = dir_ / "checkpoint.bin";
  writeFileAtomically(target, std::string_view("old content"));
  EXPECT_THROW(writeFileAtomically(target,
                                   [](std::FILE* out) {
                                     std::fputs("half of the new con", out);
                                     throw std::runtime_error("writer failed");
                                   }),
               std::runtime_error);
  EXPECT_EQ(readAll(target), "old content");
  EXPECT_EQ(entriesInDir(), 1u) << "the temp file must be removed";
}

TEST_F(FileTest, ThrowingWriterWithNoOldFileLeavesNothing) {
  const fs::path target = dir_ / "new.bin";
  EXPECT_THROW(writeFileAtomically(target, [](std::FILE*) { throw Error("stop"); }), Error);
  EXPECT_FALSE(fs::exists(target));
  EXPECT_EQ(entriesInDir(), 0u);
}

TEST_F(FileTest, MissingDirectoryIsAnError) {
  const fs::path target = dir_ / "no_such_dir" / "file.txt";
  try {
    writeFileAtomically(target, std::string_view("x"));
    FAIL() << "expected tandem::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(target.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
}

TEST_F(FileTest, MappedFileReadsContent) {
  const fs::path path = dir_ / "data";
  writeFileAtomically(path, std::string_view("hello mmap"));
  MappedFile map = MappedFile::open(path);
  ASSERT_EQ(map.size(), 10u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(map.data()), map.size()), "hello mmap");

  MappedFile moved = std::move(map);
  EXPECT_EQ(map.size(), 0u);
  EXPECT_EQ(map.data(), nullptr);
  EXPECT_EQ(moved.size(), 10u);
  MappedFile assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.size(), 10u);
}

TEST_F(FileTest, MappedFileHandlesEmptyFile) {
  const fs::path path = dir_ / "empty";
  writeFileAtomically(path, std::string_view());
  const MappedFile map = MappedFile::open(path);
  EXPECT_EQ(map.size(), 0u);
  EXPECT_TRUE(map.bytes().empty());
}

TEST_F(FileTest, MappedFileMissingOrDirectoryIsAnError) {
  const fs::path missing = dir_ / "missing.safetensors";
  try {
    MappedFile::open(missing);
    FAIL() << "expected tandem::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(MappedFile::open(dir_), Error);
}

}  // namespace
}  // namespace tandem::io
