#include "engine/io/model_summary.h"

#include <gtest/gtest.h>

#include <fstream>

#include "engine/core/error.h"
#include "engine/io/safetensors.h"

namespace tandem::io {
namespace {

using io::DType;

io::ModelConfig tinyConfig(const std::string& body) {
  return io::parseModelConfig(body, "config.json");
}

// 2 layers, layer 0 dense (first_k_dense_replace = 1), layer 1 MoE with 4 experts, top-2.
const char* kTinyDeepseek = R"({"model_type": "deepseek_v3", "hidden_size": 8,
  "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
  "vocab_size": 10, "moe_intermediate_size": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
  "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
  "q_lora_rank": null, "kv_lora_rank": 4, "qk_rope_head_dim": 2, "qk_nope_head_dim": 2,
  "v_head_dim": 2})";

TEST(ModelSummary, ClassifiesHfNames) {
  struct Case {
    const char* name;
    ParamCategory category;
    TensorRole role;
  };
  const Case cases[] = {
      {"model.embed_tokens.weight", ParamCategory::Embeddings, TensorRole::Parameter},
      {"lm_head.weight", ParamCategory::LmHead, TensorRole::Parameter},
      {"model.norm.weight", ParamCategory::Norms, TensorRole::Parameter},
      {"model.layers.0.input_layernorm.weight", ParamCategory::Norms, TensorRole::Parameter},
      {"model.layers.0.self_attn.q_proj.weight", ParamCategory::Attention, TensorRole::Parameter},
      {"model.layers.0.self_attn.q_proj.bias", ParamCategory::Attention, TensorRole::Parameter},
      {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", ParamCategory::Attention,
       TensorRole::Parameter},
      {"model.layers.0.self_attn.kv_a_layernorm.weight", ParamCategory::Norms,
       TensorRole::Parameter},
      {"model.layers.0.self_attn.q_norm.weight", ParamCategory::Norms, TensorRole::Parameter},
      {"model.layers.0.mlp.gate_proj.weight", ParamCategory::DenseMlp, TensorRole::Parameter},
      {"model.layers.0.mlp.down_proj.weight", ParamCategory::DenseMlp, TensorRole::Parameter},
      {"model.layers.1.mlp.experts.3.gate_proj.weight", ParamCategory::RoutedExperts,
       TensorRole::Parameter},
      {"model.layers.1.mlp.experts.gate_up_proj", ParamCategory::RoutedExperts,
       TensorRole::Parameter},
      {"model.layers.1.mlp.experts.down_proj", ParamCategory::RoutedExperts, TensorRole::Parameter},
      {"model.layers.1.block_sparse_moe.experts.7.w2.weight", ParamCategory::RoutedExperts,
       TensorRole::Parameter},
      {"model.layers.1.block_sparse_moe.gate.weight", ParamCategory::Router, TensorRole::Parameter},
      {"model.layers.1.mlp.gate.weight", ParamCategory::Router, TensorRole::Parameter},
      {"model.layers.1.mlp.gate.e_score_correction_bias", ParamCategory::Router,
       TensorRole::Parameter},
      {"model.layers.1.mlp.shared_experts.up_proj.weight", ParamCategory::SharedExperts,
       TensorRole::Parameter},
      {"model.layers.1.mlp.shared_expert.up_proj.weight", ParamCategory::SharedExperts,
       TensorRole::Parameter},
      {"model.layers.1.mlp.shared_expert_gate.weight", ParamCategory::SharedExperts,
       TensorRole::Parameter},
      {"model.layers.1.mlp.experts.0.up_proj.weight_scale_inv", ParamCategory::Other,
       TensorRole::QuantScale},
      {"model.layers.1.self_attn.rotary_emb.inv_freq", ParamCategory::Other, TensorRole::Buffer},
      {"model.layers.2.mlp.experts.0.up_proj.weight", ParamCategory::Other, TensorRole::ExtraLayer},
      {"model.layers.x.mlp.gate.weight", ParamCategory::Other, TensorRole::Unrecognised},
      {"model.layers.1.mlp.mystery.weight", ParamCategory::Other, TensorRole::Unrecognised},
      {"model.vision_tower.weight", ParamCategory::Other, TensorRole::Unrecognised},
      {"score.weight", ParamCategory::Other, TensorRole::Unrecognised},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TensorClass cls = classifyTensor(c.name, 2);
    EXPECT_EQ(paramCategoryKey(cls.category), paramCategoryKey(c.category));
    EXPECT_EQ(static_cast<int>(cls.role), static_cast<int>(c.role));
  }
}

std::vector<TensorRecord> tinyDeepseekTensors(bool fused) {
  std::vector<TensorRecord> t = {
      {"model.embed_tokens.weight", DType::BF16, {10, 8}},
      {"lm_head.weight", DType::BF16, {10, 8}},
      {"model.norm.weight", DType::F32, {8}},
  };
  for (int layer = 0; layer < 2; ++layer) {
    std::string p = "model.layers." + std::to_string(layer) + ".";
    t.push_back({p + "input_layernorm.weight", DType::F32, {8}});
    t.push_back({p + "post_attention_layernorm.weight", DType::F32, {8}});
    t.push_back({p + "self_attn.q_proj.weight", DType::BF16, {8, 8}});
    t.push_back({p + "self_attn.kv_a_proj_with_mqa.weight", DType::BF16, {6, 8}});
    t.push_back({p + "self_attn.kv_a_layernorm.weight", DType::F32, {4}});
    t.push_back({p + "self_attn.kv_b_proj.weight", DType::BF16, {8, 4}});
    t.push_back({p + "self_attn.o_proj.weight", DType::BF16, {8, 4}});
  }
  for (const char* proj : {"gate_proj", "up_proj"}) {
    t.push_back({std::string("model.layers.0.mlp.") + proj + ".weight", DType::BF16, {16, 8}});
  }
  t.push_back({"model.layers.0.mlp.down_proj.weight", DType::BF16, {8, 16}});
  if (fused) {
    t.push_back({"model.layers.1.mlp.experts.gate_up_proj", DType::BF16, {4, 8, 8}});
    t.push_back({"model.layers.1.mlp.experts.down_proj", DType::BF16, {4, 8, 4}});
  } else {
    for (int e = 0; e < 4; ++e) {
      std::string p = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
      t.push_back({p + "gate_proj.weight", DType::BF16, {4, 8}});
      t.push_back({p + "up_proj.weight", DType::BF16, {4, 8}});
      t.push_back({p + "down_proj.weight", DType::BF16, {8, 4}});
    }
  }
  t.push_back({"model.layers.1.mlp.gate.weight", DType::BF16, {4, 8}});
  t.push_back({"model.layers.1.mlp.gate.e_score_correction_bias", DType::F32, {4}});
  for (const char* proj : {"gate_proj", "up_proj"}) {
    t.push_back({std::string("model.layers.1.mlp.shared_experts.") + proj + ".weight",
                 DType::BF16,
                 {4, 8}});
  }
  t.push_back({"model.layers.1.mlp.shared_experts.down_proj.weight", DType::BF16, {8, 4}});
  return t;
}

TEST(ModelSummary, CountsEveryCategoryPerExpertAndFusedAlike) {
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused" : "per-expert");
    ModelSummary s = summarizeTensors(tinyConfig(kTinyDeepseek), tinyDeepseekTensors(fused));
    EXPECT_EQ(s.num_layers, 2);
    EXPECT_EQ(s.num_moe_layers, 1);
    EXPECT_EQ(s.parameters[ParamCategory::Embeddings], 80);
    EXPECT_EQ(s.parameters[ParamCategory::LmHead], 80);
    EXPECT_EQ(s.parameters[ParamCategory::Norms], 8 + 2 * (8 + 8 + 4));
    EXPECT_EQ(s.parameters[ParamCategory::Attention], 2 * (64 + 48 + 32 + 32));
    EXPECT_EQ(s.parameters[ParamCategory::DenseMlp], 3 * 128);
    EXPECT_EQ(s.parameters[ParamCategory::RoutedExperts], 4 * 3 * 32);
    EXPECT_EQ(s.parameters[ParamCategory::SharedExperts], 3 * 32);
    EXPECT_EQ(s.parameters[ParamCategory::Router], 32 + 4);
    EXPECT_EQ(s.parameters[ParamCategory::Other], 0);
    const int64_t total = 80 + 80 + 48 + 352 + 384 + 384 + 96 + 36;
    EXPECT_EQ(s.parameters.total(), total);
    EXPECT_EQ(s.active_parameters, total - 384 + 384 * 2 / 4);
    EXPECT_EQ(s.dtype_parameters.at("F32"), 48 + 4);
    EXPECT_EQ(s.dtype_parameters.at("BF16"), total - 52);
    EXPECT_EQ(s.num_unrecognised, 0u);
  }
}

TEST(ModelSummary, ScalesExtraLayersAndUnknownNamesGoToOther) {
  std::vector<TensorRecord> t = tinyDeepseekTensors(false);
  t.push_back({"model.layers.1.mlp.experts.0.up_proj.weight_scale_inv", DType::F32, {1, 1}});
  t.push_back({"model.layers.1.self_attn.q_proj.weight_scale_inv", DType::F32, {1, 1}});
  t.push_back({"model.layers.2.eh_proj.weight", DType::BF16, {8, 16}});  // DeepSeek MTP layer
  for (int i = 0; i < 12; ++i) {
    t.push_back({"model.extra_" + std::to_string(10 + i) + ".weight", DType::BF16, {2}});
  }
  ModelSummary s = summarizeTensors(tinyConfig(kTinyDeepseek), t);
  EXPECT_EQ(s.num_scale_tensors, 2u);
  EXPECT_EQ(s.num_extra_layer_tensors, 1u);
  EXPECT_EQ(s.num_unrecognised, 12u);
  ASSERT_EQ(s.unrecognised_tensors.size(), kMaxListedUnrecognised);
  EXPECT_EQ(s.unrecognised_tensors.front(), "model.extra_10.weight");
  EXPECT_EQ(s.parameters[ParamCategory::Other], 2 + 128 + 24);
  // Other is not active: only the routed experts are scaled down.
  EXPECT_EQ(s.active_parameters,
            s.parameters.total() - s.parameters[ParamCategory::Other] - 384 + 192);
}

TEST(ModelSummary, DenseModelHasNoRoutedExperts) {
  io::ModelConfig config = tinyConfig(R"({"model_type": "llama", "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10,
    "tie_word_embeddings": true})");
  std::vector<TensorRecord> t = {{"model.embed_tokens.weight", DType::BF16, {10, 8}},
                                 {"model.layers.0.mlp.up_proj.weight", DType::BF16, {16, 8}}};
  ModelSummary s = summarizeTensors(config, t);
  EXPECT_EQ(s.num_moe_layers, 0);
  EXPECT_EQ(s.parameters.total(), 80 + 128);
  EXPECT_EQ(s.active_parameters, 80 + 128);
  EXPECT_EQ(s.parameters[ParamCategory::LmHead], 0);  // tied: stored once, as embeddings
}

TEST(ModelSummary, ReadsAModelDirectory) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "tandem_model_summary_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << kTinyDeepseek;
  std::vector<TensorRecord> records = tinyDeepseekTensors(false);
  std::vector<std::vector<std::byte>> storage;
  std::vector<io::TensorToWrite> tensors;
  for (const TensorRecord& r : records) {
    int64_t n = 1;
    for (int64_t d : r.shape) n *= d;
    storage.emplace_back(static_cast<size_t>(n) * io::dtypeSize(r.dtype));
  }
  for (size_t i = 0; i < records.size(); ++i) {
    tensors.push_back({records[i].name, records[i].dtype, records[i].shape, storage[i]});
  }
  io::writeSafetensors(dir / "model.safetensors", tensors);
  ModelSummary s = summarizeModel(dir);
  EXPECT_EQ(s.num_tensors, records.size());
  EXPECT_EQ(s.num_files, 1u);
  EXPECT_EQ(s.bytes_on_disk, std::filesystem::file_size(dir / "model.safetensors"));
  EXPECT_EQ(s.parameters[ParamCategory::RoutedExperts], 384);
  EXPECT_EQ(s.config.model_type, "deepseek_v3");

  std::filesystem::remove(dir / "model.safetensors");
  EXPECT_THROW(summarizeModel(dir), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::io
