// safetensors: writer -> reader round trips, a table of hostile files that must each be rejected
// with a tandem::Error saying what is wrong, and sharded model directories.

#include "engine/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/platform/process_info.h"
#include "engine/io/atomic_file.h"

namespace tandem::io {
namespace {

namespace fs = std::filesystem;

constexpr DType kAllDTypes[] = {DType::F64,     DType::F32, DType::F16, DType::BF16, DType::F8_E4M3,
                                DType::F8_E5M2, DType::I64, DType::I32, DType::I16,  DType::I8,
                                DType::U64,     DType::U32, DType::U16, DType::U8,   DType::Bool};

std::string u64le(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
  return bytes;
}

// [u64 header length][header][data_bytes zero bytes]
std::string fileBytes(const std::string& header, size_t data_bytes) {
  return u64le(header.size()) + header + std::string(data_bytes, '\0');
}

std::vector<std::byte> randomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> bytes(n);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng() & 0xFF);
  return bytes;
}

std::span<const std::byte> asBytes(const std::string& text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem_st_test_" + std::to_string(platform::currentProcessId()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path writeRaw(const std::string& name, const std::string& bytes) {
    const fs::path path = dir_ / name;
    writeFileAtomically(path, std::string_view(bytes));
    return path;
  }

  fs::path dir_;
};

// ---- round trips ------------------------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripEveryDTypeScalarAndZeroSize) {
  std::vector<std::vector<std::byte>> storage;
  std::vector<TensorToWrite> tensors;
  uint32_t seed = 1;
  for (DType dtype : kAllDTypes) {
    const std::string name(dtypeName(dtype));
    const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {name + ".matrix", {2, 3}}, {name + ".scalar", {}}, {name + ".empty", {0, 4}}};
    for (const auto& [tensor_name, shape] : shapes) {
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      storage.push_back(randomBytes(static_cast<size_t>(numel) * dtypeSize(dtype), seed++));
      tensors.push_back({tensor_name, dtype, shape, storage.back()});
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "ünïcødé"}};
  const fs::path path = dir_ / "all.safetensors";
  writeSafetensors(path, tensors, metadata);

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.header().metadata, metadata);
  ASSERT_EQ(file.header().tensors.size(), tensors.size());
  for (const TensorToWrite& expected : tensors) {
    SCOPED_TRACE(expected.name);
    const TensorView view = file.view(expected.name);
    ASSERT_NE(view.info, nullptr);
    EXPECT_EQ(view.info->dtype, expected.dtype);
    EXPECT_EQ(view.info->shape, expected.shape);
    EXPECT_EQ(static_cast<size_t>(view.info->numel()) * dtypeSize(expected.dtype),
              expected.bytes.size());
    ASSERT_EQ(view.bytes.size(), expected.bytes.size());
    EXPECT_EQ(0, std::memcmp(view.bytes.data(), expected.bytes.data(), expected.bytes.size()));
  }
  // The reference writer pads the header so the data section starts 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  char prefix[8];
  in.read(prefix, 8);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, prefix, 8);
  EXPECT_EQ((8 + header_bytes) % 8, 0u);

  const SafetensorsModel model = SafetensorsModel::open(path);
  EXPECT_EQ(model.names().size(), tensors.size());
  EXPECT_TRUE(model.contains("BF16.scalar"));
  EXPECT_EQ(model.totalFileBytes(), fs::file_size(path));
  EXPECT_THROW(model.view("missing"), Error);
}

TEST_F(SafetensorsTest, RoundTripEmptyFileAndDirectoryLookup) {
  writeSafetensors(dir_ / "model.safetensors", {});
  const SafetensorsModel model = SafetensorsModel::open(dir_);
  EXPECT_TRUE(model.names().empty());
  ASSERT_EQ(model.files().size(), 1u);
}

TEST_F(SafetensorsTest, WriterRejectsWrongByteCount) {
  const std::vector<std::byte> bytes(10);
  const TensorToWrite tensor{"w", DType::F32, {3}, bytes};
  try {
    writeSafetensors(dir_ / "bad.safetensors", {&tensor, 1});
    FAIL() << "expected tandem::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"w\""), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "bad.safetensors"));
  const TensorToWrite twice[] = {{"a", DType::U8, {}, {bytes.data(), 1}},
                                 {"a", DType::U8, {}, {bytes.data(), 1}}};
  EXPECT_THROW(writeSafetensors(dir_ / "dup.safetensors", twice), Error);
}

// ---- hostile files ----------------------------------------------------------------------------

struct HostileCase {
  const char* what;
  std::string bytes;
  const char* expected_phrase;
};

std::string header1(const std::string& entry) { return "{\"t\":" + entry + "}"; }

std::vector<HostileCase> hostileCases() {
  const std::string ok_entry = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  return {
      {"shorter than 8 bytes", "abc", "shorter than 8 bytes"},
      {"header length past EOF", u64le(100) + "{}", "past the end of the file"},
      {"header length UINT64_MAX", u64le(UINT64_MAX) + "{}", "past the end of the file"},
      {"header not JSON", fileBytes("{not json", 0), "not valid JSON"},
      {"header truncated JSON", fileBytes("{\"t\":{\"dtype\":", 0), "not valid JSON"},
      {"header invalid UTF-8", fileBytes("{\"t\xff\":1}", 0), "not valid UTF-8"},
      {"header overlong UTF-8", fileBytes("{\"\xc0\xaf\":1}", 0), "not valid UTF-8"},
      {"header a JSON array", fileBytes("[1,2]", 0), "not a JSON object"},
      {"header empty", fileBytes("", 0), "not valid JSON"},
      {"nesting too deep", fileBytes(header1("[[[[[[[[1]]]]]]]]"), 0), "nested too deeply"},
      {"entry not an object", fileBytes(header1("[1]"), 0), "must be an object"},
      {"unknown dtype",
       fileBytes(header1(R"({"dtype":"F128","shape":[1],"data_offsets":[0,4]})"), 4),
       "unknown dtype"},
      {"dtype not a string",
       fileBytes(header1(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})"), 4),
       "\"dtype\" must be a string"},
      {"missing field", fileBytes(header1(R"({"dtype":"F32","shape":[1]})"), 4), "missing field"},
      {"extra field",
       fileBytes(header1(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1})"), 4),
       "unexpected field"},
      {"negative offset",
       fileBytes(header1(R"({"dtype":"U8","shape":[4],"data_offsets":[-4,0]})"), 4),
       "two non-negative integers"},
      {"offsets as floats",
       fileBytes(header1(R"({"dtype":"F32","shape":[1],"data_offsets":[0.0,4.0]})"), 4),
       "two non-negative integers"},
      {"offsets as strings",
       fileBytes(header1(R"({"dtype":"F32","shape":[1],"data_offsets":["0","4"]})"), 4),
       "two non-negative integers"},
      {"three offsets",
       fileBytes(header1(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})"), 4),
       "two non-negative integers"},
      {"end before begin",
       fileBytes(header1(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})"), 8),
       "is before begin"},
      {"end past data section",
       fileBytes(header1(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})"), 4),
       "past the end of the data section"},
      {"overlapping tensors",
       fileBytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 12),
       "overlap"},
      {"gap between tensors",
       fileBytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                 12),
       "gap"},
      {"trailing bytes after last tensor", fileBytes(header1(ok_entry), 12),
       "not covered by any tensor"},
      {"shape x dtype != end - begin",
       fileBytes(header1(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), 8),
       "does not match"},
      {"shape claims 8 GB in a tiny file",
       fileBytes(
           header1(R"({"dtype":"F32","shape":[2147483648,4],"data_offsets":[0,34359738368]})"), 16),
       "past the end of the data section"},
      {"shape claims 8 GB, offsets small",
       fileBytes(header1(R"({"dtype":"F32","shape":[2147483648,4],"data_offsets":[0,16]})"), 16),
       "does not match"},
      {"shape product overflows u64",
       fileBytes(
           header1(R"({"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]})"), 0),
       "overflows"},
      {"shape bytes overflow u64",
       fileBytes(header1(R"({"dtype":"F64","shape":[2305843009213693952,2],"data_offsets":[0,0]})"),
                 0),
       "overflows"},
      {"negative shape entry",
       fileBytes(header1(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"), 4),
       "negative dimension"},
      {"float shape entry",
       fileBytes(header1(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"), 4),
       "non-negative integers"},
      {"huge shape entry",
       fileBytes(header1(R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,4]})"),
                 4),
       "non-negative integers"},
      {"shape not an array",
       fileBytes(header1(R"({"dtype":"F32","shape":4,"data_offsets":[0,4]})"), 4),
       "\"shape\" must be an array"},
      {"metadata with non-string value",
       fileBytes(
           R"({"__metadata__":{"format":"pt","step":1},)" + std::string("\"t\":") + ok_entry + "}",
           4),
       "is a JSON number, not a string"},
      {"metadata not an object", fileBytes(R"({"__metadata__":"pt"})", 0),
       "must be an object of strings"},
      {"empty tensor name",
       fileBytes(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
       "empty tensor name"},
      {"duplicate tensor name",
       fileBytes(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                 4),
       "twice"},
  };
}

TEST_F(SafetensorsTest, HostileFilesAreRejectedWithAClearError) {
  int index = 0;
  for (const HostileCase& c : hostileCases()) {
    SCOPED_TRACE(c.what);
    const fs::path path = writeRaw("hostile_" + std::to_string(index++) + ".safetensors", c.bytes);
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << "accepted a hostile file: " << c.what;
    } catch (const Error& e) {
      const std::string text = e.what();
      EXPECT_NE(text.find(c.expected_phrase), std::string::npos) << "message: " << text;
      EXPECT_NE(text.find(path.string()), std::string::npos) << "must name the file: " << text;
      EXPECT_FALSE(e.whatToDo().empty()) << text;
    }
  }
}

TEST_F(SafetensorsTest, ErrorNamesTheTensor) {
  const std::string header =
      R"({"layers.0.weight":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  try {
    parseSafetensorsHeader(asBytes(header), 8, "label.safetensors");
    FAIL() << "expected tandem::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("\"layers.0.weight\""), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, HeaderOverTheSizeCapIsRejected) {
  // A sparse file: the header claims 100 MB + 1 bytes and the file is that long, without writing
  // 100 MB to disk.
  const fs::path path = dir_ / "huge_header.safetensors";
  writeRaw("huge_header.safetensors", u64le(100'000'001));
  fs::resize_file(path, 8 + 100'000'001);
  try {
    SafetensorsFile::open(path);
    FAIL() << "expected tandem::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("100 MB limit"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, AcceptsWhitespacePaddingZeroSizeAndAdjacentTensors) {
  // Padded as the reference writer pads; zero-size tensors sit at the same offset as others.
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                             R"("z0":{"dtype":"BF16","shape":[0,7],"data_offsets":[0,0]},)"
                             R"("b":{"dtype":"U8","shape":[],"data_offsets":[4,5]}}     )";
  const SafetensorsHeader parsed = parseSafetensorsHeader(asBytes(header), 5, "padded");
  ASSERT_EQ(parsed.tensors.size(), 4u);
  EXPECT_EQ(parsed.tensors.front().name, "z0");  // sorted by offset
  EXPECT_EQ(parsed.tensors.back().name, "b");
  EXPECT_EQ(parsed.tensors.back().numel(), 1);

  const SafetensorsHeader empty = parseSafetensorsHeader(asBytes(std::string("{}")), 0, "empty");
  EXPECT_TRUE(empty.tensors.empty());
}

// ---- sharded models ---------------------------------------------------------------------------

class ShardedModelTest : public SafetensorsTest {
 protected:
  void writeShards() {
    a_ = randomBytes(16, 7);
    b_ = randomBytes(6, 8);
    const TensorToWrite shard1[] = {{"model.embed.weight", DType::F32, {2, 2}, a_}};
    const TensorToWrite shard2[] = {{"model.norm.weight", DType::BF16, {3}, b_},
                                    {"lm_head.weight", DType::U8, {0}, {}}};
    writeSafetensors(dir_ / "model-00001-of-00002.safetensors", shard1, {{"format", "pt"}});
    writeSafetensors(dir_ / "model-00002-of-00002.safetensors", shard2, {{"format", "pt"}});
  }
  void writeIndex(const std::string& weight_map_json) {
    writeRaw("model.safetensors.index.json",
             R"({"metadata":{"total_size":22},"weight_map":)" + weight_map_json + "}");
  }
  static std::string defaultWeightMap() {
    return R"({"model.embed.weight":"model-00001-of-00002.safetensors",)"
           R"("model.norm.weight":"model-00002-of-00002.safetensors",)"
           R"("lm_head.weight":"model-00002-of-00002.safetensors"})";
  }
  std::string openError() {
    try {
      SafetensorsModel::open(dir_);
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected tandem::Error";
    return {};
  }

  std::vector<std::byte> a_, b_;
};

TEST_F(ShardedModelTest, IndexWithTwoShardsOpens) {
  writeShards();
  writeIndex(defaultWeightMap());
  for (const fs::path& where : {dir_, dir_ / "model.safetensors.index.json"}) {
    const SafetensorsModel model = SafetensorsModel::open(where);
    EXPECT_EQ(model.files().size(), 2u);
    EXPECT_EQ(model.names(), (std::vector<std::string>{"lm_head.weight", "model.embed.weight",
                                                       "model.norm.weight"}));
    const TensorView norm = model.view("model.norm.weight");
    ASSERT_EQ(norm.bytes.size(), b_.size());
    EXPECT_EQ(0, std::memcmp(norm.bytes.data(), b_.data(), b_.size()));
    EXPECT_EQ(model.find("model.embed.weight")->shape, (std::vector<int64_t>{2, 2}));
    EXPECT_TRUE(model.view("lm_head.weight").bytes.empty());
  }
}

TEST_F(ShardedModelTest, MissingShardIsNamed) {
  writeShards();
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  writeIndex(defaultWeightMap());
  const std::string error = openError();
  EXPECT_NE(error.find("model-00002-of-00002.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("model.safetensors.index.json"), std::string::npos) << error;
}

TEST_F(ShardedModelTest, TensorMissingFromItsShardIsNamed) {
  writeShards();
  writeIndex(R"({"model.embed.weight":"model-00001-of-00002.safetensors",)"
             R"("model.final.weight":"model-00002-of-00002.safetensors"})");
  const std::string error = openError();
  EXPECT_NE(error.find("model.final.weight"), std::string::npos) << error;
}

TEST_F(ShardedModelTest, TensorInTheWrongShardIsAnError) {
  writeShards();
  writeIndex(R"({"model.embed.weight":"model-00002-of-00002.safetensors",)"
             R"("model.norm.weight":"model-00002-of-00002.safetensors"})");
  const std::string error = openError();
  EXPECT_NE(error.find("model.embed.weight"), std::string::npos) << error;
}

TEST_F(ShardedModelTest, TensorInTwoShardsIsAnError) {
  writeShards();
  const TensorToWrite again[] = {{"model.embed.weight", DType::F32, {2, 2}, a_}};
  writeSafetensors(dir_ / "extra.safetensors", again);
  writeIndex(R"({"model.embed.weight":"model-00001-of-00002.safetensors",)"
             R"("other":"extra.safetensors"})");
  const std::string error = openError();
  EXPECT_NE(error.find("appears in two shards"), std::string::npos) << error;
}

TEST_F(ShardedModelTest, ShardNameWithPathIsRefused) {
  writeShards();
  writeIndex(R"({"model.embed.weight":"../model-00001-of-00002.safetensors"})");
  EXPECT_NE(openError().find("not a plain file name"), std::string::npos);
  writeIndex(R"({"model.embed.weight":"/etc/passwd"})");
  EXPECT_NE(openError().find("not a plain file name"), std::string::npos);
}

TEST_F(ShardedModelTest, BadIndexJsonIsAnError) {
  writeShards();
  writeRaw("model.safetensors.index.json", "{\"weight_map\": [");
  EXPECT_NE(openError().find("not valid JSON"), std::string::npos);
  writeRaw("model.safetensors.index.json", "{\"metadata\": {}}");
  EXPECT_NE(openError().find("weight_map"), std::string::npos);
}

TEST_F(ShardedModelTest, DirectoryWithoutIndex) {
  writeRaw("config.json", "{}");
  std::string error = openError();
  EXPECT_NE(error.find("no .safetensors file in"), std::string::npos) << error;
  EXPECT_NE(error.find("config.json"), std::string::npos) << error;

  writeShards();  // two files, no index: ambiguous
  error = openError();
  EXPECT_NE(error.find("several .safetensors files"), std::string::npos) << error;

  fs::remove(dir_ / "model-00002-of-00002.safetensors");  // exactly one: use it
  EXPECT_EQ(SafetensorsModel::open(dir_).names(), std::vector<std::string>{"model.embed.weight"});

  EXPECT_THROW(SafetensorsModel::open(dir_ / "does_not_exist"), Error);
}

}  // namespace
}  // namespace tandem::io
