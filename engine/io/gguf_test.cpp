// GGUF: dequantizers against ggml's own output, writer -> reader round trips, a table of hostile
// files that must each be rejected with a tandem::Error saying what is wrong, and the typed
// getters.

#include "engine/io/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/float_convert.h"
#include "engine/core/platform/process_info.h"
#include "engine/io/atomic_file.h"

namespace tandem::io {
namespace {

namespace fs = std::filesystem;

std::span<const std::byte> asBytes(const std::string& text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<GgmlType> typeByName(std::string_view name) {
  for (uint32_t raw = 0; raw < 64; ++raw) {
    const std::optional<GgmlTypeTraits> traits = ggmlTypeTraits(raw);
    if (traits && traits->name == name) return static_cast<GgmlType>(raw);
  }
  return std::nullopt;
}

// ---- dequantizers against ggml ---------------------------------------------------------------

struct QuantVector {
  std::string type_name;
  int64_t block_elems = 0, block_bytes = 0;
  std::vector<std::byte> bytes;
  std::vector<float> dequant;
};

std::vector<QuantVector> loadQuantVectors() {
  std::ifstream in(fs::path(TANDEM_IO_TESTDATA_DIR) / "ggml_quant_vectors.txt");
  std::vector<QuantVector> vectors;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string tag;
    fields >> tag;
    if (tag == "type") {
      QuantVector v;
      std::string blck, type_size;
      fields >> v.type_name >> blck >> v.block_elems >> type_size >> v.block_bytes;
      vectors.push_back(v);
    } else if (tag == "bytes" && !vectors.empty()) {
      std::string hex;
      fields >> hex;
      for (size_t i = 0; i + 1 < hex.size(); i += 2) {
        vectors.back().bytes.push_back(
            static_cast<std::byte>(std::stoul(hex.substr(i, 2), nullptr, 16)));
      }
    } else if (tag == "dequant" && !vectors.empty()) {
      std::string number;
      while (fields >> number)
        vectors.back().dequant.push_back(std::strtof(number.c_str(), nullptr));
    }
  }
  return vectors;
}

TEST(GgufQuant, ReproducesGgmlDequantizeRow) {
  const std::vector<QuantVector> vectors = loadQuantVectors();
  ASSERT_EQ(vectors.size(), 15u) << "testdata/ggml_quant_vectors.txt is missing or incomplete";
  for (const QuantVector& v : vectors) {
    SCOPED_TRACE(v.type_name);
    const std::optional<GgmlType> type = typeByName(v.type_name);
    ASSERT_TRUE(type.has_value());
    const GgmlTypeTraits traits = *ggmlTypeTraits(static_cast<uint32_t>(*type));
    EXPECT_EQ(traits.block_elems, v.block_elems);
    EXPECT_EQ(traits.block_bytes, v.block_bytes);
    EXPECT_TRUE(traits.dequantizable);
    ASSERT_EQ(v.dequant.size(), 256u);
    std::vector<float> out(256, std::nanf(""));
    dequantizeGgml(*type, v.bytes, 256, out.data(), v.type_name);
    for (size_t i = 0; i < out.size(); ++i) {
      // The text has 9 significant digits, which round-trip every float, so the bits must match.
      ASSERT_EQ(floatBits(out[i]), floatBits(v.dequant[i]))
          << "first bad index " << i << ": got " << out[i] << ", ggml " << v.dequant[i];
    }
  }
}

TEST(GgufQuant, Q8KAndPlainTypes) {
  struct {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
  } q8k{};
  static_assert(sizeof(q8k) == 292);
  q8k.d = 0.25f;
  for (int j = 0; j < 256; ++j) q8k.qs[j] = static_cast<int8_t>(j - 128);
  std::vector<std::byte> bytes(sizeof(q8k));
  std::memcpy(bytes.data(), &q8k, sizeof(q8k));
  std::vector<float> out(256);
  dequantizeGgml(GgmlType::Q8_K, bytes, 256, out.data(), "q8k");
  for (int j = 0; j < 256; ++j) ASSERT_EQ(out[j], 0.25f * static_cast<float>(j - 128)) << j;

  const int32_t ints[3] = {-7, 0, 1 << 24};
  std::vector<std::byte> int_bytes(sizeof(ints));
  std::memcpy(int_bytes.data(), ints, sizeof(ints));
  dequantizeGgml(GgmlType::I32, int_bytes, 3, out.data(), "i32");
  EXPECT_EQ(out[0], -7.0f);
  EXPECT_EQ(out[2], 16777216.0f);
  const double doubles[2] = {0.1, -1e300};
  std::vector<std::byte> double_bytes(sizeof(doubles));
  std::memcpy(double_bytes.data(), doubles, sizeof(doubles));
  dequantizeGgml(GgmlType::F64, double_bytes, 2, out.data(), "f64");
  EXPECT_EQ(out[0], 0.1f);
  EXPECT_TRUE(std::isinf(out[1]) && out[1] < 0);
  // Unaligned fp16 input (alignment-1 files put tensors at odd addresses).
  std::vector<std::byte> f16(5);
  const uint16_t one = 0x3C00, minus_two = 0xC000;
  std::memcpy(f16.data() + 1, &one, 2);
  std::memcpy(f16.data() + 3, &minus_two, 2);
  dequantizeGgml(GgmlType::F16, std::span<const std::byte>(f16).subspan(1), 2, out.data(), "f16");
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
}

TEST(GgufQuant, RefusesWhatItCannotConvert) {
  std::vector<std::byte> block(66);
  std::vector<float> out(256);
  try {
    dequantizeGgml(GgmlType::IQ2_XXS, block, 256, out.data(), "blk.0.ffn_down.weight");
    FAIL() << "IQ2_XXS has no dequantizer";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("blk.0.ffn_down.weight"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("iq2_xxs"), std::string::npos) << e.message();
    EXPECT_NE(e.whatToDo().find("llama-quantize to Q4_K_M, Q5_K_M, Q6_K or Q8_0"),
              std::string::npos);
  }
  for (GgmlType type :
       {GgmlType::Q8_1, GgmlType::IQ1_S, GgmlType::IQ3_S, GgmlType::TQ1_0, GgmlType::TQ2_0}) {
    EXPECT_FALSE(ggmlTypeTraits(static_cast<uint32_t>(type))->dequantizable) << ggmlTypeName(type);
  }
  std::vector<std::byte> q8(34);
  EXPECT_THROW(dequantizeGgml(GgmlType::Q8_0, q8, 16, out.data(), "t"), Error);  // not whole blocks
  EXPECT_THROW(dequantizeGgml(GgmlType::Q8_0, q8, 64, out.data(), "t"), Error);  // too few bytes
  EXPECT_THROW(dequantizeGgml(static_cast<GgmlType>(4), q8, 32, out.data(), "t"),
               Error);  // unknown
}

// ---- writer -> reader round trips ------------------------------------------------------------

class GgufFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem_gguf_test_" + std::to_string(platform::currentProcessId()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

using Metadata = std::vector<std::pair<std::string, GgufValue>>;

Metadata everyValueType() {
  GgufValue f64{GgufValueType::Float64, GgufValueType::UInt32, -2.5e-300};
  GgufValue bools{GgufValueType::Array, GgufValueType::Bool, std::vector<bool>{true, false, true}};
  GgufValue empty{GgufValueType::Array, GgufValueType::Int32, std::vector<int64_t>{}};
  return {
      {"general.architecture", GgufValue::ofString("llama")},
      {"t.u8", GgufValue::ofInt64(255, GgufValueType::UInt8)},
      {"t.i8", GgufValue::ofInt64(-128, GgufValueType::Int8)},
      {"t.u16", GgufValue::ofInt64(65535, GgufValueType::UInt16)},
      {"t.i16", GgufValue::ofInt64(-32768, GgufValueType::Int16)},
      {"t.u32", GgufValue::ofUInt32(4000000000u)},
      {"t.i32", GgufValue::ofInt64(-2000000000, GgufValueType::Int32)},
      {"t.f32", GgufValue::ofFloat32(1e-6f)},
      {"t.bool", GgufValue::ofBool(true)},
      {"t.string", GgufValue::ofString("h\xC3\xA9llo \xE2\x9C\x93")},
      {"t.u64", GgufValue::ofInt64(std::numeric_limits<int64_t>::max(), GgufValueType::UInt64)},
      {"t.i64", GgufValue::ofInt64(std::numeric_limits<int64_t>::min())},
      {"t.f64", f64},
      {"t.ints8", GgufValue::ofInts({-1, 2, -3}, GgufValueType::Int8)},
      {"t.ints_u16", GgufValue::ofInts({0, 65535}, GgufValueType::UInt16)},
      {"t.ints32", GgufValue::ofInts({1, -2, 3, 151643}, GgufValueType::Int32)},
      {"t.ints_u64", GgufValue::ofInts({0, 1ll << 62}, GgufValueType::UInt64)},
      {"t.floats32",
       GgufValue::ofFloats({0.5, -1.25, static_cast<double>(3e38f)}, GgufValueType::Float32)},
      {"t.floats64", GgufValue::ofFloats({0.1, -1e300}, GgufValueType::Float64)},
      {"t.strings", GgufValue::ofStrings({"a", "", "\xC4\xA0the", std::string("nul\0byte", 8)})},
      {"t.bools", bools},
      {"t.empty", empty},
  };
}

struct TensorData {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  std::vector<std::byte> bytes;
};

std::vector<TensorData> severalTensors() {
  std::vector<TensorData> tensors = {
      {"token_embd.weight", GgmlType::F32, {5, 3}, {}},
      {"norm.weight", GgmlType::F16, {7}, {}},
      {"blk.0.attn_q.weight", GgmlType::Q8_0, {64, 2}, {}},
      {"blk.0.ffn_down.weight", GgmlType::Q4_K, {256, 3}, {}},
      {"positions", GgmlType::I32, {2, 2, 2, 2}, {}},
      {"blk.0.attn_k.weight", GgmlType::BF16, {3}, {}},
  };
  uint32_t seed = 7;
  for (TensorData& t : tensors) {
    const GgmlTypeTraits traits = *ggmlTypeTraits(static_cast<uint32_t>(t.type));
    int64_t numel = 1;
    for (int64_t d : t.ne) numel *= d;
    t.bytes.resize(static_cast<size_t>(numel / traits.block_elems * traits.block_bytes));
    for (std::byte& b : t.bytes)
      b = static_cast<std::byte>((seed = seed * 1103515245u + 12345u) >> 24);
  }
  return tensors;
}

std::vector<GgufTensorToWrite> toWrite(const std::vector<TensorData>& tensors) {
  std::vector<GgufTensorToWrite> out;
  for (const TensorData& t : tensors) out.push_back({t.name, t.type, t.ne, t.bytes});
  return out;
}

void expectSameValue(const GgufValue& a, const GgufValue& b, const std::string& key) {
  EXPECT_EQ(a.type, b.type) << key;
  if (a.type == GgufValueType::Array) {
    EXPECT_EQ(a.element_type, b.element_type) << key;
  }
  EXPECT_TRUE(a.value == b.value) << key;
}

TEST_F(GgufFileTest, RoundTripsEveryValueTypeAndSeveralTensorTypes) {
  const Metadata metadata = everyValueType();
  const std::vector<TensorData> tensors = severalTensors();
  const fs::path path = dir_ / "model.gguf";
  writeGguf(path, metadata, toWrite(tensors), 64);

  const GgufFile file = GgufFile::open(path);
  const GgufHeader& header = file.header();
  EXPECT_EQ(header.version, 3u);
  EXPECT_EQ(header.alignment, 64u);
  EXPECT_EQ(header.data_offset % 64, 0u);
  ASSERT_EQ(header.metadata.size(), metadata.size() + 1);  // + general.alignment, appended
  for (size_t i = 0; i < metadata.size(); ++i) {
    EXPECT_EQ(header.metadata[i].first, metadata[i].first);
    expectSameValue(header.metadata[i].second, metadata[i].second, metadata[i].first);
  }
  EXPECT_EQ(header.metadata.back().first, "general.alignment");
  EXPECT_EQ(file.getInt("general.alignment"), 64);

  ASSERT_EQ(header.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorInfo* info = file.findTensor(tensors[i].name);
    ASSERT_NE(info, nullptr) << tensors[i].name;
    EXPECT_EQ(info, &header.tensors[i]);
    EXPECT_EQ(info->type, tensors[i].type);
    EXPECT_EQ(info->ne, tensors[i].ne);
    EXPECT_EQ(info->offset % 64, 0u);
    const std::span<const std::byte> bytes = file.tensorBytes(*info);
    ASSERT_EQ(bytes.size(), tensors[i].bytes.size());
    EXPECT_EQ(std::memcmp(bytes.data(), tensors[i].bytes.data(), bytes.size()), 0)
        << tensors[i].name;
  }
  EXPECT_EQ(file.findTensor("token_embd.weight")->torchShape(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(file.findTensor("positions")->numel(), 16);
  EXPECT_EQ(file.findTensor("missing"), nullptr);
}

// Re-writing what was read gives the same bytes, for the default, a large and the smallest
// alignment.
TEST_F(GgufFileTest, CopyIsByteIdentical) {
  for (uint64_t alignment : {uint64_t{32}, uint64_t{256}, uint64_t{1}}) {
    SCOPED_TRACE(alignment);
    const fs::path original = dir_ / "a.gguf";
    const fs::path copy = dir_ / "b.gguf";
    writeGguf(original, everyValueType(), toWrite(severalTensors()), alignment);
    const GgufFile file = GgufFile::open(original);
    std::vector<GgufTensorToWrite> tensors;
    for (const GgufTensorInfo& t : file.header().tensors)
      tensors.push_back({t.name, t.type, t.ne, file.tensorBytes(t)});
    writeGguf(copy, file.header().metadata, tensors, file.header().alignment);
    EXPECT_EQ(readFile(original), readFile(copy));
  }
}

TEST_F(GgufFileTest, DequantizeReadsTheMappedTensor) {
  const std::vector<QuantVector> vectors = loadQuantVectors();
  const auto q6k = std::find_if(vectors.begin(), vectors.end(),
                                [](const QuantVector& v) { return v.type_name == "q6_K"; });
  ASSERT_NE(q6k, vectors.end());
  const fs::path path = dir_ / "q6k.gguf";
  const GgufTensorToWrite tensor{"w", GgmlType::Q6_K, {256}, q6k->bytes};
  writeGguf(path, {}, std::span(&tensor, 1), 1);
  const GgufFile file = GgufFile::open(path);
  const std::vector<float> values = file.dequantize(*file.findTensor("w"));
  ASSERT_EQ(values.size(), 256u);
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(floatBits(values[i]), floatBits(q6k->dequant[i])) << i;

  const std::vector<std::byte> iq2_block(66);
  const GgufTensorToWrite iq2{"blk.3.ffn_gate.weight", GgmlType::IQ2_XXS, {256}, iq2_block};
  // A file of its own: Windows cannot replace a file while `file` still maps it.
  const fs::path iq2_path = dir_ / "iq2.gguf";
  writeGguf(iq2_path, {}, std::span(&iq2, 1));
  const GgufFile iq2_file = GgufFile::open(iq2_path);
  try {
    iq2_file.dequantize(*iq2_file.findTensor("blk.3.ffn_gate.weight"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(iq2_path.string()), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("blk.3.ffn_gate.weight"), std::string::npos) << e.message();
  }
}

TEST_F(GgufFileTest, WriterRefusesWhatTheReaderWouldRefuse) {
  const std::vector<std::byte> f32(16);
  const GgufTensorToWrite ok{"t", GgmlType::F32, {4}, f32};
  const fs::path path = dir_ / "bad.gguf";
  auto expectError = [&](const Metadata& metadata, std::vector<GgufTensorToWrite> tensors,
                         uint64_t alignment, const std::string& needle) {
    try {
      writeGguf(path, metadata, tensors, alignment);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
      EXPECT_NE(e.message().find(path.string()), std::string::npos) << e.message();
    }
    EXPECT_FALSE(fs::exists(path));
  };
  expectError({{"k", GgufValue::ofInt64(300, GgufValueType::UInt8)}}, {ok}, 32,
              "\"k\": uint8 value 300 is out of range");
  expectError({{"k", GgufValue::ofBool(true)}, {"k", GgufValue::ofBool(false)}}, {ok}, 32,
              "key \"k\" is used twice");
  expectError({{"", GgufValue::ofBool(true)}}, {ok}, 32, "key \"\" is empty");
  expectError({{"k\xFF", GgufValue::ofBool(true)}}, {ok}, 32, "is not valid UTF-8");
  expectError({{"k", GgufValue{GgufValueType::String, GgufValueType::UInt32, int64_t{1}}}}, {ok},
              32, "declared string but holds another kind of value");
  expectError(
      {{"k", GgufValue{GgufValueType::Array, GgufValueType::Array, std::vector<int64_t>{}}}}, {ok},
      32, "arrays of arrays");
  expectError({{"general.alignment", GgufValue::ofUInt32(64)}}, {ok}, 32, "general.alignment");
  expectError({}, {ok, ok}, 32, "tensor \"t\" is used twice");
  expectError({}, {{"t", GgmlType::F32, {5}, f32}}, 32, "need 20");
  expectError({}, {{"t", GgmlType::Q8_0, {4}, f32}}, 32,
              "not a multiple of the q8_0 block size 32");
  expectError({}, {{"t", GgmlType::F32, {2, 0, 2}, f32}}, 32, "dimension below 1");
  expectError({}, {{"t", GgmlType::F32, {1, 1, 1, 1, 4}, f32}}, 32, "5 dimensions");
  expectError({}, {ok}, 24, "alignment 24 is not a power of two");
  expectError({}, {ok}, 0, "alignment 0");
}

// ---- hostile files ---------------------------------------------------------------------------

// Hand-assembled GGUF bytes, for files the writer would never produce.
struct Bytes {
  std::string data;
  template <typename T>
  Bytes& put(T value) {
    char raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    data.append(raw, sizeof(T));
    return *this;
  }
  Bytes& str(std::string_view s) {
    put<uint64_t>(s.size());
    data.append(s);
    return *this;
  }
  Bytes& kv(std::string_view key, uint32_t type) {
    str(key);
    return put<uint32_t>(type);
  }
  Bytes& tensor(std::string_view name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (int64_t d : ne) put<int64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Bytes& padTo(size_t alignment) {
    data.append((alignment - data.size() % alignment) % alignment, '\0');
    return *this;
  }
  Bytes& zeros(size_t n) {
    data.append(n, '\0');
    return *this;
  }
};

Bytes headerFor(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
  Bytes b;
  b.data = "GGUF";
  return b.put<uint32_t>(version).put<uint64_t>(tensors).put<uint64_t>(kvs);
}

// One key and two tensors: "a" f32 [8] at 0 (32 bytes) and "b" q8_0 [32, 2] at 32 (68 bytes).
Bytes twoTensors(uint64_t a_offset = 0, uint64_t b_offset = 32, size_t data_bytes = 100) {
  Bytes b = headerFor(2, 1);
  b.kv("general.architecture", 8).str("llama");
  b.tensor("a", {8}, 0, a_offset).tensor("b", {32, 2}, 8, b_offset);
  return b.padTo(32).zeros(data_bytes);
}

struct HostileCase {
  std::string name;
  std::string bytes;
  std::string needle;  // must appear in the Error's message
};

std::vector<HostileCase> hostileCases() {
  constexpr uint64_t kHuge = uint64_t{1} << 60;
  // Zeros after the entry keep kv_count plausible, so that the entry itself is what fails.
  auto oneKv = [](auto fill) {
    Bytes b = headerFor(0, 1);
    fill(b);
    return b.zeros(64).data;
  };
  auto oneTensor = [](std::vector<int64_t> ne, uint32_t type, uint64_t offset = 0) {
    Bytes b = headerFor(1, 0);
    b.tensor("w", std::move(ne), type, offset);
    return b.padTo(32).zeros(4096).data;
  };
  std::string big_endian = "GGUF";
  big_endian += std::string("\0\0\0\3", 4) + std::string(16, '\0');
  return {
      {"empty file", "", "is empty"},
      {"short magic", "GG", "the magic"},
      {"bad magic", "GGML" + std::string(20, '\0'), "does not start with the GGUF magic"},
      {"version 1", headerFor(0, 0, 1).data, "GGUF v1"},
      {"big-endian", big_endian, "big-endian"},
      {"version 4", headerFor(0, 0, 4).data, "version 4"},
      {"truncated counts", headerFor(0, 0).data.substr(0, 14), "tensor_count"},
      {"huge kv_count", headerFor(0, kHuge).data, "kv_count 1152921504606846976 cannot fit"},
      {"huge tensor_count", headerFor(kHuge, 0).data,
       "tensor_count 1152921504606846976 cannot fit"},
      {"key length past EOF", oneKv([](Bytes& b) { b.put<uint64_t>(1000).data += "abc"; }),
       "the key claims 1000 bytes"},
      {"huge string value", oneKv([](Bytes& b) { b.kv("k", 8).put<uint64_t>(uint64_t{1} << 62); }),
       "key \"k\": a string value claims"},
      {"huge array", oneKv([](Bytes& b) { b.kv("k", 9).put<uint32_t>(0).put<uint64_t>(kHuge); }),
       "key \"k\": array length"},
      {"huge string array", oneKv([](Bytes& b) {
         b.kv("k", 9).put<uint32_t>(8).put<uint64_t>(3).str("a").put<uint64_t>(kHuge);
       }),
       "an array string claims"},
      {"unknown value type", oneKv([](Bytes& b) { b.kv("k", 13).put<uint32_t>(0); }),
       "key \"k\": unknown value type 13"},
      {"nested arrays", oneKv([](Bytes& b) {
         b.kv("k", 9).put<uint32_t>(9).put<uint64_t>(1).put<uint32_t>(0).put<uint64_t>(0);
       }),
       "key \"k\": is an array of arrays"},
      {"unknown element type",
       oneKv([](Bytes& b) { b.kv("k", 9).put<uint32_t>(40).put<uint64_t>(0); }),
       "unknown array element type 40"},
      {"bool not 0/1", oneKv([](Bytes& b) { b.kv("k", 7).put<uint8_t>(2); }),
       "key \"k\": bool value is 2"},
      {"uint64 above int64", oneKv([](Bytes& b) { b.kv("k", 10).put<uint64_t>(~uint64_t{0}); }),
       "above 2^63-1"},
      {"invalid UTF-8 key", oneKv([](Bytes& b) { b.kv("bad\xC0\xAF", 4).put<uint32_t>(1); }),
       "key/value #0: key is not valid UTF-8"},
      {"empty key", oneKv([](Bytes& b) { b.kv("", 4).put<uint32_t>(1); }), "has an empty key"},
      {"duplicate key",
       [] {
         Bytes b = headerFor(0, 2);
         b.kv("k", 4).put<uint32_t>(1).kv("k", 4).put<uint32_t>(2);
         return b.zeros(64).data;
       }(),
       "key \"k\": appears twice in the metadata"},
      {"alignment not a power of two",
       oneKv([](Bytes& b) { b.kv("general.alignment", 4).put<uint32_t>(24); }),
       "\"general.alignment\": is 24, which is not a power of two"},
      {"alignment 0", oneKv([](Bytes& b) { b.kv("general.alignment", 4).put<uint32_t>(0); }),
       "is 0, which is not a power of two"},
      {"alignment not uint32",
       oneKv([](Bytes& b) { b.kv("general.alignment", 10).put<uint64_t>(64); }),
       "must be a uint32, not a uint64"},
      {"n_dims 0", oneTensor({}, 0), "tensor \"w\": has 0 dimensions"},
      {"n_dims 5", oneTensor({1, 1, 1, 1, 1}, 0), "tensor \"w\": has 5 dimensions"},
      {"dim 0", oneTensor({4, 0}, 0), "ne[1] is 0"},
      {"negative dim", oneTensor({-1}, 0), "ne[0] is -1"},
      {"ne product overflows", oneTensor({int64_t{1} << 32, int64_t{1} << 32}, 0),
       "number of elements overflows 64 bits"},
      {"byte size overflows", oneTensor({int64_t{1} << 62}, 0), "byte size overflows"},
      {"unknown ggml type", oneTensor({4}, 4), "tensor \"w\": has unknown ggml type 4"},
      {"ggml type past the table", oneTensor({4}, 1000), "unknown ggml type 1000"},
      {"ne[0] not whole blocks", oneTensor({48, 2}, 12),
       "ne[0] = 48 is not a multiple of the q4_K block size 256"},
      {"misaligned offset", twoTensors(0, 40).data,
       "tensor \"b\": data offset 40 is not a multiple of the alignment 32"},
      {"tensor past EOF", twoTensors(0, 32, 99).data,
       "tensor \"b\": its 68 bytes at data offset 32 end past the end"},
      {"tensor offset far past EOF", twoTensors(0, uint64_t{1} << 63).data, "tensor \"b\""},
      {"overlapping tensors", twoTensors(64, 0).data,
       "tensor \"a\" at data offset 64 overlaps tensor \"b\""},
      {"duplicate tensor",
       [] {
         Bytes b = headerFor(2, 0);
         b.tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32);
         return b.padTo(32).zeros(64).data;
       }(),
       "tensor \"w\": appears twice in the tensor list"},
      {"invalid UTF-8 name",
       [] {
         Bytes b = headerFor(1, 0);
         b.tensor("\xED\xA0\x80", {8}, 0, 0);
         return b.padTo(32).zeros(32).data;
       }(),
       "tensor #0: name is not valid UTF-8"},
      {"empty tensor name",
       [] {
         Bytes b = headerFor(1, 0);
         b.tensor("", {8}, 0, 0);
         return b.padTo(32).zeros(32).data;
       }(),
       "tensor #0: has an empty name"},
  };
}

TEST(GgufHostile, EachFileIsRejectedWithAMessageNamingTheProblem) {
  ASSERT_NO_THROW(parseGguf(asBytes(twoTensors().data), "valid.gguf"));  // the base the cases break
  for (const HostileCase& c : hostileCases()) {
    SCOPED_TRACE(c.name);
    // An exactly sized heap copy, so that a sanitizer build catches any read past the end.
    const std::vector<std::byte> bytes(asBytes(c.bytes).begin(), asBytes(c.bytes).end());
    try {
      parseGguf(bytes, "hostile.gguf");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.message().rfind("hostile.gguf: ", 0), 0u) << e.message();
      EXPECT_NE(e.message().find(c.needle), std::string::npos) << e.message();
      EXPECT_FALSE(e.whatToDo().empty());
    }
  }
}

// Every cut before the end of the last tensor's bytes loses something the file promised; cuts in
// the trailing padding keep every tensor whole and are accepted, as llama.cpp's loader does.
TEST_F(GgufFileTest, EveryTruncationIsAnError) {
  const fs::path path = dir_ / "full.gguf";
  writeGguf(path, everyValueType(), toWrite(severalTensors()), 64);
  const std::string full = readFile(path);
  const GgufHeader header = parseGguf(asBytes(full), "full");
  uint64_t tensors_end = 0;
  for (const GgufTensorInfo& t : header.tensors)
    tensors_end = std::max(tensors_end, header.data_offset + t.offset + t.byte_size);
  ASSERT_LT(tensors_end, full.size());  // the last tensor is followed by padding
  for (size_t cut = 0; cut < tensors_end; ++cut) {
    const std::vector<std::byte> bytes(asBytes(full).begin(),
                                       asBytes(full).begin() + static_cast<ptrdiff_t>(cut));
    EXPECT_THROW(parseGguf(bytes, "cut"), Error) << "cut at " << cut << " of " << full.size();
  }
  for (size_t cut = tensors_end; cut <= full.size(); ++cut) {
    EXPECT_NO_THROW(parseGguf(asBytes(full.substr(0, cut)), "cut")) << cut;
  }
}

TEST_F(GgufFileTest, OpenNamesThePath) {
  const fs::path path = dir_ / "not.gguf";
  writeFileAtomically(path, std::string_view("GGUF\1\0\0\0"));
  try {
    GgufFile::open(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(path.string()), std::string::npos) << e.message();
    EXPECT_NE(e.whatToDo().find("re-convert"), std::string::npos) << e.whatToDo();
  }
  writeFileAtomically(path, std::string_view(""));
  EXPECT_THROW(GgufFile::open(path), Error);
}

// ---- typed getters ---------------------------------------------------------------------------

TEST_F(GgufFileTest, TypedGettersNameTheKey) {
  const fs::path path = dir_ / "meta.gguf";
  writeGguf(path, everyValueType(), {});
  const GgufFile file = GgufFile::open(path);
  EXPECT_EQ(file.getString("general.architecture"), "llama");
  EXPECT_EQ(file.getInt("t.u8"), 255);
  EXPECT_EQ(file.getInt("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(file.getFloat("t.f32"), static_cast<double>(1e-6f));
  EXPECT_EQ(file.getFloat("t.u32"), 4e9);  // integers are numbers too
  EXPECT_TRUE(file.getBool("t.bool"));
  EXPECT_EQ(file.getStrings("t.strings").size(), 4u);
  EXPECT_EQ(file.getInts("t.ints32"), (std::vector<int64_t>{1, -2, 3, 151643}));
  EXPECT_EQ(file.getFloats("t.floats64"), (std::vector<double>{0.1, -1e300}));
  EXPECT_EQ(file.optInt("absent"), std::nullopt);
  EXPECT_EQ(file.optString("absent"), std::nullopt);
  EXPECT_EQ(file.optFloat("t.f64"), -2.5e-300);
  EXPECT_EQ(file.optBool("t.bool"), true);
  EXPECT_NE(file.find("t.bools"), nullptr);
  EXPECT_EQ(file.find("absent"), nullptr);

  auto expectError = [&](auto get, const std::string& needle) {
    try {
      get();
      ADD_FAILURE() << "expected: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(path.string()), std::string::npos) << e.message();
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
      EXPECT_FALSE(e.whatToDo().empty());
    }
  };
  expectError([&] { file.getString("t.u32"); }, "metadata key \"t.u32\" is uint32, not a string");
  expectError([&] { file.getInt("t.f32"); }, "\"t.f32\" is float32, not an integer");
  expectError([&] { file.getFloat("t.string"); }, "\"t.string\" is string, not a number");
  expectError([&] { file.getBool("t.u8"); }, "\"t.u8\" is uint8, not a bool");
  expectError([&] { file.getInts("t.floats32"); },
              "\"t.floats32\" is array of float32, not an array of integers");
  expectError([&] { file.getFloats("t.ints8"); }, "\"t.ints8\" is array of int8");
  expectError([&] { file.getStrings("t.bools"); }, "\"t.bools\" is array of bool");
  expectError([&] { file.optInt("t.string"); }, "\"t.string\" is string, not an integer");
  expectError([&] { file.getInt("llama.block_count"); },
              "metadata key \"llama.block_count\" is missing");
  expectError([&] { file.getStrings("tokenizer.ggml.tokens"); },
              "\"tokenizer.ggml.tokens\" is missing");
}

}  // namespace
}  // namespace tandem::io
