// The GGUF model view on small files written here: config.json from the metadata, stacked experts
// sliced per expert, llama's rope permutation undone, the tokenizer rebuilt, and what is refused.
// tests/parity/test_gguf_model.py checks the same against llama.cpp's converter, llama.cpp and
// transformers on real conversions.

#include "engine/io/gguf_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <numeric>

#include "engine/core/error.h"
#include "engine/core/platform/process_info.h"
#include "engine/io/model_config.h"
#include "engine/io/tokenizer.h"

namespace tandem::io {
namespace {

namespace fs = std::filesystem;
using Metadata = std::vector<std::pair<std::string, GgufValue>>;

class GgufModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem_gguf_model_" + std::to_string(platform::currentProcessId()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // F32 tensors whose values are their flat index plus `base`, ggml order `ne`.
  void addTensor(const std::string& name, std::vector<int64_t> ne, float base = 0) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    auto& values = storage_.emplace_back(static_cast<size_t>(n));
    std::iota(values.begin(), values.end(), base);
    tensors_.push_back(
        {name,
         GgmlType::F32,
         std::move(ne),
         {reinterpret_cast<const std::byte*>(values.data()), values.size() * sizeof(float)}});
  }

  // A byte-level tokenizer of five tokens: "a", "b", "ab", and two control tokens.
  static void addTokenizer(Metadata& m, const std::string& pre = "qwen2") {
    m.emplace_back("tokenizer.ggml.model", GgufValue::ofString("gpt2"));
    m.emplace_back("tokenizer.ggml.pre", GgufValue::ofString(pre));
    m.emplace_back("tokenizer.ggml.tokens",
                   GgufValue::ofStrings({"a", "b", "ab", "<|im_end|>", "<|bos|>"}));
    m.emplace_back("tokenizer.ggml.token_type",
                   GgufValue::ofInts({1, 1, 1, 3, 3}, GgufValueType::Int32));
    m.emplace_back("tokenizer.ggml.merges", GgufValue::ofStrings({"a b"}));
    m.emplace_back("tokenizer.ggml.eos_token_id", GgufValue::ofUInt32(3));
    m.emplace_back("tokenizer.ggml.bos_token_id", GgufValue::ofUInt32(4));
  }

  // A 1-layer qwen3moe: hidden 8, 2 heads of 4 (kv 1), 3 experts of width 2, vocab 5.
  Metadata qwen3moe() {
    Metadata m = {{"general.architecture", GgufValue::ofString("qwen3moe")},
                  {"qwen3moe.block_count", GgufValue::ofUInt32(1)},
                  {"qwen3moe.context_length", GgufValue::ofUInt32(64)},
                  {"qwen3moe.embedding_length", GgufValue::ofUInt32(8)},
                  {"qwen3moe.feed_forward_length", GgufValue::ofUInt32(16)},
                  {"qwen3moe.attention.head_count", GgufValue::ofUInt32(2)},
                  {"qwen3moe.attention.head_count_kv", GgufValue::ofUInt32(1)},
                  {"qwen3moe.attention.key_length", GgufValue::ofUInt32(4)},
                  {"qwen3moe.rope.freq_base", GgufValue::ofFloat32(1e6f)},
                  {"qwen3moe.attention.layer_norm_rms_epsilon", GgufValue::ofFloat32(1e-6f)},
                  {"qwen3moe.expert_count", GgufValue::ofUInt32(3)},
                  {"qwen3moe.expert_used_count", GgufValue::ofUInt32(2)},
                  {"qwen3moe.expert_feed_forward_length", GgufValue::ofUInt32(2)}};
    addTokenizer(m);
    if (tensors_.empty()) {
      addTensor("token_embd.weight", {8, 5});
      addTensor("output_norm.weight", {8});
      addTensor("blk.0.attn_q.weight", {8, 8});
      addTensor("blk.0.ffn_gate_exps.weight", {8, 2, 3});
      addTensor("blk.0.ffn_down_exps.weight", {2, 8, 3});
      addTensor("blk.0.nextn.eh_proj.weight", {2});
    }
    return m;
  }

  fs::path write(const Metadata& m, const std::string& file = "model.gguf") {
    writeGguf(dir_ / file, m, tensors_);
    return dir_ / file;
  }

  fs::path dir_;
  std::vector<std::vector<float>> storage_;
  std::vector<GgufTensorToWrite> tensors_;
};

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_F(GgufModelTest, TranslatesMetadataIntoTheConfigTheEngineReads) {
  const fs::path file = write(qwen3moe());
  EXPECT_TRUE(isGgufPath(file));
  EXPECT_TRUE(isGgufPath(dir_));  // a directory with one .gguf and no config.json
  const ModelConfig c = readModelConfig(dir_);
  EXPECT_EQ(c.architecture, Architecture::Qwen3Moe);
  EXPECT_EQ(c.hidden_size, 8);
  EXPECT_EQ(c.num_hidden_layers, 1);
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.vocab_size, 5);
  EXPECT_EQ(c.num_experts, 3);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.tie_word_embeddings);  // no output.weight
  EXPECT_EQ(c.source, file);
}

TEST_F(GgufModelTest, SlicesStackedExpertsAndKeepsUnmappedNames) {
  write(qwen3moe());
  const std::unique_ptr<GgufModel> model = GgufModel::open(dir_);
  const GgufTensorSource* gate1 = model->find("model.layers.0.mlp.experts.1.gate_proj.weight");
  ASSERT_NE(gate1, nullptr);
  EXPECT_EQ(gate1->shape, (std::vector<int64_t>{2, 8}));
  const std::vector<float> values = model->read(*gate1);
  ASSERT_EQ(values.size(), 16u);
  EXPECT_EQ(values.front(), 16.0f);  // expert 1 starts after expert 0's 2 × 8 values
  EXPECT_EQ(values.back(), 31.0f);
  EXPECT_NE(model->find("model.layers.0.mlp.experts.2.down_proj.weight"), nullptr);
  EXPECT_EQ(model->find("model.layers.0.mlp.experts.3.down_proj.weight"), nullptr);
  EXPECT_EQ(model->unmapped(), std::vector<std::string>{"blk.0.nextn.eh_proj.weight"});
}

TEST_F(GgufModelTest, UndoesTheRopePermutationOfLlamaQueries) {
  Metadata m = {{"general.architecture", GgufValue::ofString("llama")},
                {"llama.block_count", GgufValue::ofUInt32(1)},
                {"llama.embedding_length", GgufValue::ofUInt32(8)},
                {"llama.feed_forward_length", GgufValue::ofUInt32(16)},
                {"llama.attention.head_count", GgufValue::ofUInt32(2)},
                {"llama.attention.layer_norm_rms_epsilon", GgufValue::ofFloat32(1e-5f)}};
  addTokenizer(m, "llama-bpe");
  addTensor("token_embd.weight", {8, 5});
  // The converter's permute(): HF rows (head, half, j) stored as (head, j, half). Rows of 8 heads'
  // worth: HF row r holds the value r in every column, so the stored row says where it came from.
  std::vector<float>& stored = storage_.emplace_back(64);
  const int heads = 2, head_rows = 4, half = 2;
  for (int h = 0; h < heads; ++h) {
    for (int s = 0; s < 2; ++s) {
      for (int j = 0; j < half; ++j) {
        const int hf_row = h * head_rows + s * half + j, gguf_row = h * head_rows + j * 2 + s;
        for (int col = 0; col < 8; ++col)
          stored[static_cast<size_t>(gguf_row * 8 + col)] = static_cast<float>(hf_row);
      }
    }
  }
  tensors_.push_back(
      {"blk.0.attn_q.weight",
       GgmlType::F32,
       {8, 8},
       {reinterpret_cast<const std::byte*>(stored.data()), stored.size() * sizeof(float)}});
  write(m);
  const std::unique_ptr<GgufModel> model = GgufModel::open(dir_ / "model.gguf");
  EXPECT_EQ(readModelConfig(dir_ / "model.gguf").architecture, Architecture::Llama);
  const std::vector<float> q = model->read(*model->find("model.layers.0.self_attn.q_proj.weight"));
  for (int row = 0; row < 8; ++row)
    EXPECT_EQ(q[static_cast<size_t>(row * 8)], static_cast<float>(row)) << row;
}

TEST_F(GgufModelTest, ReadsLlama31RopeScalingBackFromItsDivisors) {
  // Llama-3.1-8B's rope (theta 500000, head_dim 128, factor 8, low 1, high 4, original 8192),
  // stored as llama.cpp's converter stores it: one divisor per rotary pair.
  constexpr double kTheta = 500000, kFactor = 8, kLow = 1, kHigh = 4, kOriginal = 8192;
  std::vector<float>& divisors = storage_.emplace_back(64);
  for (size_t i = 0; i < divisors.size(); ++i) {
    const double wavelen =
        2 * std::numbers::pi * std::pow(kTheta, 2.0 * static_cast<double>(i) / 128);
    const double smooth = (kOriginal / wavelen - kLow) / (kHigh - kLow);
    divisors[i] = wavelen < kOriginal / kHigh ? 1.0f
                  : wavelen > kOriginal / kLow
                      ? static_cast<float>(kFactor)
                      : static_cast<float>(1 / ((1 - smooth) / kFactor + smooth));
  }
  tensors_.push_back(
      {"rope_freqs.weight",
       GgmlType::F32,
       {64},
       {reinterpret_cast<const std::byte*>(divisors.data()), divisors.size() * sizeof(float)}});
  addTensor("token_embd.weight", {8, 5});
  Metadata m = {{"general.architecture", GgufValue::ofString("llama")},
                {"llama.block_count", GgufValue::ofUInt32(1)},
                {"llama.embedding_length", GgufValue::ofUInt32(8)},
                {"llama.feed_forward_length", GgufValue::ofUInt32(16)},
                {"llama.attention.head_count", GgufValue::ofUInt32(1)},
                {"llama.rope.freq_base", GgufValue::ofFloat32(static_cast<float>(kTheta))},
                {"llama.attention.layer_norm_rms_epsilon", GgufValue::ofFloat32(1e-5f)}};
  addTokenizer(m, "llama-bpe");
  write(m);
  const ModelConfig c = readModelConfig(dir_);
  EXPECT_EQ(c.rope.type, RopeType::Llama3);
  EXPECT_DOUBLE_EQ(c.rope.factor, kFactor);
  EXPECT_NEAR(*c.rope.low_freq_factor, kLow, 1e-4);
  EXPECT_NEAR(*c.rope.high_freq_factor, kHigh, 1e-4);
  EXPECT_EQ(*c.rope.original_max_position_embeddings, 8192);
}

TEST_F(GgufModelTest, RebuildsTheByteLevelTokenizer) {
  Metadata m = qwen3moe();
  m.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::ofBool(true));
  m.emplace_back("tokenizer.chat_template", GgufValue::ofString("{{ messages }}"));
  write(m);
  const Tokenizer tok = Tokenizer::load(dir_);
  EXPECT_EQ(tok.encode("abab"), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(tok.encode("ab<|im_end|>", /*add_special_tokens=*/true),
            (std::vector<int32_t>{4, 2, 3}));
  EXPECT_EQ(tok.eosId(), 3);
  EXPECT_EQ(tok.bosId(), 4);
  EXPECT_TRUE(tok.isSpecial(3));
  const nlohmann::json config = nlohmann::json::parse(GgufModel::open(dir_)->tokenizerConfigJson());
  EXPECT_EQ(config.at("chat_template"), "{{ messages }}");
}

TEST_F(GgufModelTest, RefusesWhatItDoesNotRead) {
  Metadata m = qwen3moe();
  m[0].second = GgufValue::ofString("gemma3");
  write(m, "gemma.gguf");
  EXPECT_NE(errorOf([&] {
              readModelConfig(dir_ / "gemma.gguf");
            }).find("general.architecture is 'gemma3'"),
            std::string::npos);

  Metadata spm = qwen3moe();
  for (auto& [key, value] : spm) {
    if (key == "tokenizer.ggml.model") value = GgufValue::ofString("bert");
  }
  write(spm, "spm.gguf");
  EXPECT_NE(
      errorOf([&] { Tokenizer::load(dir_ / "spm.gguf"); }).find("tokenizer.ggml.model is 'bert'"),
      std::string::npos);

  Metadata pre = qwen3moe();
  for (auto& [key, value] : pre) {
    if (key == "tokenizer.ggml.pre") value = GgufValue::ofString("chatglm-bpe");
  }
  write(pre, "pre.gguf");
  EXPECT_NE(errorOf([&] { Tokenizer::load(dir_ / "pre.gguf"); }).find("'chatglm-bpe'"),
            std::string::npos);

  // Several files in a directory: which one is meant is the user's call.
  EXPECT_NE(errorOf([&] { ggufFileOf(dir_); }).find("holds 3 .gguf files"), std::string::npos);
  write(qwen3moe(), "big-00001-of-00002.gguf");
  EXPECT_NE(errorOf([&] {
              GgufModel::open(dir_ / "big-00001-of-00002.gguf");
            }).find("llama-gguf-split --merge"),
            std::string::npos);
}

// A SentencePiece (llama) tokenizer: pieces in id order, no merges in the file.
Metadata sentencePiece(const std::vector<std::string>& pieces) {
  std::vector<int64_t> types(pieces.size(), 1);
  types[0] = 2;  // <unk>
  types[1] = 3;  // <s>
  return {{"tokenizer.ggml.model", GgufValue::ofString("llama")},
          {"tokenizer.ggml.tokens", GgufValue::ofStrings(pieces)},
          {"tokenizer.ggml.token_type", GgufValue::ofInts(types, GgufValueType::Int32)},
          {"tokenizer.ggml.bos_token_id", GgufValue::ofUInt32(1)},
          {"tokenizer.ggml.add_bos_token", GgufValue::ofBool(false)}};
}

TEST_F(GgufModelTest, RebuildsSentencePieceMergesFromEverySplitIntoTwoPieces) {
  Metadata m = qwen3moe();
  std::erase_if(m, [](const auto& kv) { return kv.first.starts_with("tokenizer."); });
  const std::vector<std::string> pieces = {"<unk>", "<s>", "\u2581",  "a",
                                           "b",     "ab",  "\u2581a", "\u2581ab"};
  for (auto& kv : sentencePiece(pieces)) m.push_back(kv);
  write(m);
  const nlohmann::json merges =
      nlohmann::json::parse(GgufModel::open(dir_)->tokenizerJson()).at("model").at("merges");
  // transformers' generate_merges: by the merged piece's id, then the shorter left part first.
  using J = nlohmann::json;
  const J expected = J::array({J::array({"a", "b"}), J::array({"\u2581", "a"}),
                               J::array({"\u2581", "ab"}), J::array({"\u2581a", "b"})});
  EXPECT_EQ(merges, expected);
  EXPECT_EQ(Tokenizer::load(dir_).encode("ab"), (std::vector<int32_t>{7}));
}

TEST_F(GgufModelTest, LongSentencePieceTokensLoad) {
  // Every split of a 1 MB piece was hashed afresh: 105 s. Now O(length * log tokens).
  Metadata m = qwen3moe();
  std::erase_if(m, [](const auto& kv) { return kv.first.starts_with("tokenizer."); });
  const std::string long_piece(1 << 20, 'x');
  for (auto& kv : sentencePiece(
           {"<unk>", "<s>", "\u2581", "x", "xx", "\u00e9", long_piece, long_piece + "\u00e9"}))
    m.push_back(kv);
  write(m);
  const nlohmann::json merges =
      nlohmann::json::parse(GgufModel::open(dir_)->tokenizerJson()).at("model").at("merges");
  using J = nlohmann::json;  // "xx", and the long piece + é
  const J expected = J::array({J::array({"x", "x"}), J::array({long_piece, "\u00e9"})});
  EXPECT_EQ(merges, expected);
}

TEST_F(GgufModelTest, InvalidUtf8InTokenizerMetadataNamesTheEntry) {
  Metadata m = qwen3moe();
  for (auto& [key, value] : m) {
    if (key == "tokenizer.ggml.tokens")
      value = GgufValue::ofStrings({"a", "\xff\xfe", "ab", "<|im_end|>", "<|bos|>"});
  }
  write(m);
  // Before: nlohmann's type_error 316 from dump(), "internal error, please report this".
  EXPECT_NE(errorOf([&] {
              Tokenizer::load(dir_);
            }).find("tokenizer.ggml.tokens holds token 1, which is not valid UTF-8"),
            std::string::npos);
  Metadata bad_template = qwen3moe();
  bad_template.emplace_back("tokenizer.chat_template", GgufValue::ofString("{{ \xc3 }}"));
  write(bad_template);
  EXPECT_NE(
      errorOf([&] { Tokenizer::load(dir_); }).find("tokenizer.chat_template is not valid UTF-8"),
      std::string::npos);
}

}  // namespace
}  // namespace tandem::io
