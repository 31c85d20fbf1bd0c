#include "engine/placement/expert_format.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/io/gguf.h"

namespace tandem::placement {
namespace {

// The GGUF formats' block sizes are ggml's, as the reader of engine/io knows them.
TEST(ExpertFormat, GgufBlocksAreGgmlsBlocks) {
  const std::pair<const char*, io::GgmlType> gguf[] = {
      {"q8_0", io::GgmlType::Q8_0},  {"q4_0", io::GgmlType::Q4_0}, {"q4_k", io::GgmlType::Q4_K},
      {"q5_k", io::GgmlType::Q5_K},  {"q6_k", io::GgmlType::Q6_K}, {"iq4_xs", io::GgmlType::IQ4_XS},
      {"mxfp4", io::GgmlType::MXFP4}};
  for (const auto& [name, type] : gguf) {
    const ExpertFormat f = expertFormat(name);
    const io::GgmlTypeTraits traits = *io::ggmlTypeTraits(static_cast<uint32_t>(type));
    EXPECT_EQ(f.block_weights, traits.block_elems) << name;
    EXPECT_EQ(f.block_bytes, traits.block_bytes) << name;
    EXPECT_TRUE(f.computed_as_stored) << name;
  }
  EXPECT_DOUBLE_EQ(expertFormat("q4_k").bitsPerWeight(), 4.5);
  EXPECT_DOUBLE_EQ(expertFormat("q6_k").bitsPerWeight(), 6.5625);
}

TEST(ExpertFormat, MatrixBytesCountValuesAndScales) {
  // Qwen3-30B-A3B's gate [768, 2048].
  EXPECT_EQ(expertFormat("bf16").matrixBytes(768, 2048), 768u * 2048 * 2);
  EXPECT_EQ(expertFormat("int8").matrixBytes(768, 2048), 768u * 2048 + 768 * 4);
  // fp8: DeepSeek's [ceil(out/128), ceil(in/128)] f32 scales; 7168 = 56 · 128, 2048 = 16 · 128.
  EXPECT_EQ(expertFormat("fp8").matrixBytes(2048, 7168), 2048u * 7168 + 16 * 56 * 4);
  // int4: 16 bytes of nibbles + a 16-bit scale per 32 weights (+ a 16-bit minimum asymmetric).
  EXPECT_EQ(expertFormat("int4").matrixBytes(768, 2048), 768u * 64 * 18);
  EXPECT_EQ(expertFormat("int4:g128:asym").matrixBytes(768, 2048), 768u * 16 * 68);
  EXPECT_EQ(expertFormat("q4_k").matrixBytes(768, 2048), 768u * 8 * 144);
  EXPECT_FALSE(expertFormat("bf16").computed_as_stored);
  EXPECT_TRUE(expertFormat("int4:g64").computed_as_stored);
}

TEST(ExpertFormat, Int4NamesAndUnknownNames) {
  EXPECT_EQ(int4FormatName(32, true), "int4");
  EXPECT_EQ(int4FormatName(128, false), "int4:g128:asym");
  for (const std::string& name : expertFormatNames()) EXPECT_TRUE(isExpertFormat(name)) << name;
  EXPECT_THROW(int4FormatName(48, true), Error);
  try {
    expertFormat("q3_k");
    FAIL() << "q3_k is not held";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q3_k"), std::string::npos);
    EXPECT_NE(e.whatToDo().find("q4_k"), std::string::npos);
  }
}

}  // namespace
}  // namespace tandem::placement
