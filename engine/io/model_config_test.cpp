#include "engine/io/model_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"

namespace tandem::io {
namespace {

using Json = nlohmann::json;

// Abridged from the configs published with the models (transformers 4.x spelling).
Json qwen3MoeClassic() {
  return Json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": false,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "mlp_only_layers": [], "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false,
    "vocab_size": 151936})");
}

Json deepseekV3Classic() {
  return Json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": false,
    "first_k_dense_replace": 3, "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280})");
}

Json deepseekV2LiteClassic() {
  return Json::parse(R"({
    "model_type": "deepseek_v2", "first_k_dense_replace": 1, "hidden_size": 2048,
    "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16", "v_head_dim": 128,
    "vocab_size": 102400})");
}

Json mixtralClassic() {
  return Json::parse(R"({
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 32000})");
}

Json qwen2MoeClassic() {
  return Json::parse(R"({
    "model_type": "qwen2_moe", "decoder_sparse_step": 1, "hidden_size": 2048,
    "intermediate_size": 5632, "max_position_embeddings": 8192, "moe_intermediate_size": 1408,
    "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_sliding_window": false, "vocab_size": 151936})");
}

Json llama3Classic() {
  return Json::parse(R"({
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 128256})");
}

Json denseClassic(const char* model_type) {
  Json j = Json::parse(R"({"hidden_size": 1024, "intermediate_size": 3072,
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rope_theta": 1000000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "vocab_size": 151936, "max_position_embeddings": 40960})");
  j["model_type"] = model_type;
  return j;
}

// What transformers 5.17 save_pretrained writes: "rope_parameters" holds rope_theta and the
// scaling, "dtype" replaces "torch_dtype", qwen3_moe says "num_local_experts".
Json toTransformers5(Json j) {
  Json rope = j.contains("rope_scaling") && j["rope_scaling"].is_object() ? j["rope_scaling"]
                                                                          : Json::object();
  if (rope.contains("type")) rope["rope_type"] = rope["type"];
  if (!rope.contains("rope_type")) rope["rope_type"] = "default";
  rope["rope_theta"] = j.value("rope_theta", 10000.0);
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = rope;
  j["dtype"] = j["torch_dtype"];
  j.erase("torch_dtype");
  if (j["model_type"] == "qwen3_moe") {
    j["num_local_experts"] = j["num_experts"];
    j.erase("num_experts");
  }
  if (j["model_type"] == "mixtral" || j["model_type"] == "deepseek_v3") j["head_dim"] = nullptr;
  return j;
}

ModelConfig parse(const Json& j) { return parseModelConfig(j.dump(), "config.json"); }

class BothForms : public ::testing::TestWithParam<bool> {
 protected:
  ModelConfig parseForm(const Json& classic) {
    return parse(GetParam() ? toTransformers5(classic) : classic);
  }
};

TEST_P(BothForms, Qwen3Moe) {
  ModelConfig c = parseForm(qwen3MoeClassic());
  EXPECT_EQ(c.architecture, Architecture::Qwen3Moe);
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.head_dim, 128);  // explicit, not 2048 / 32
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope.type, RopeType::Default);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.numMoeLayers(), 48);
  EXPECT_FALSE(c.quantization.has_value());
}

TEST_P(BothForms, DeepseekV3) {
  ModelConfig c = parseForm(deepseekV3Classic());
  EXPECT_EQ(c.architecture, Architecture::DeepseekV3);
  EXPECT_TRUE(c.isMla());
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.numMoeLayers(), 58);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(c.scoring_func, ScoringFunc::Sigmoid);
  EXPECT_EQ(c.topk_method, TopkMethod::NoauxTc);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.rope.type, RopeType::Yarn);
  EXPECT_DOUBLE_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast.value(), 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow.value(), 1.0);
  EXPECT_DOUBLE_EQ(c.rope.mscale.value(), 1.0);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim.value(), 1.0);
  ASSERT_TRUE(c.quantization.has_value());
  EXPECT_EQ(c.quantization->quant_method, "fp8");
  EXPECT_EQ(c.quantization->fmt, "e4m3");
  EXPECT_EQ(c.quantization->weight_block_size, (std::vector<int64_t>{128, 128}));
}

TEST_P(BothForms, DeepseekV2Lite) {
  ModelConfig c = parseForm(deepseekV2LiteClassic());
  EXPECT_EQ(c.architecture, Architecture::DeepseekV2);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.scoring_func, ScoringFunc::Softmax);
  EXPECT_EQ(c.topk_method, TopkMethod::Greedy);
  EXPECT_EQ(c.numMoeLayers(), 26);
  EXPECT_FALSE(c.isMoeLayer(0));
  EXPECT_DOUBLE_EQ(c.rope.mscale.value(), 0.707);
}

TEST_P(BothForms, Mixtral) {
  ModelConfig c = parseForm(mixtralClassic());
  EXPECT_EQ(c.architecture, Architecture::Mixtral);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.moe_intermediate_size, 14336);  // every expert has the dense width
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.numMoeLayers(), 32);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
}

TEST_P(BothForms, Qwen2Moe) {
  ModelConfig c = parseForm(qwen2MoeClassic());
  EXPECT_EQ(c.architecture, Architecture::Qwen2Moe);
  EXPECT_EQ(c.num_experts, 60);
  EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.sliding_window, 32768);
  EXPECT_FALSE(c.use_sliding_window);
  EXPECT_EQ(c.numMoeLayers(), 24);
}

TEST_P(BothForms, Llama3) {
  ModelConfig c = parseForm(llama3Classic());
  EXPECT_EQ(c.architecture, Architecture::Llama);
  EXPECT_FALSE(c.isMoe());
  EXPECT_EQ(c.numMoeLayers(), 0);
  EXPECT_EQ(c.rope.type, RopeType::Llama3);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.low_freq_factor.value(), 1.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor.value(), 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
}

TEST_P(BothForms, Qwen2AndQwen3) {
  ModelConfig q2 = parseForm(denseClassic("qwen2"));
  EXPECT_EQ(q2.architecture, Architecture::Qwen2);
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_FALSE(q2.qk_norm);
  EXPECT_TRUE(q2.tie_word_embeddings);
  EXPECT_EQ(q2.head_dim, 64);
  Json q3 = denseClassic("qwen3");
  q3["head_dim"] = 128;
  ModelConfig c3 = parseForm(q3);
  EXPECT_EQ(c3.architecture, Architecture::Qwen3);
  EXPECT_TRUE(c3.qk_norm);
  EXPECT_FALSE(c3.attention_bias);
  EXPECT_EQ(c3.head_dim, 128);
}

INSTANTIATE_TEST_SUITE_P(ModelConfig, BothForms, ::testing::Bool(), [](const auto& param_info) {
  return param_info.param ? "transformers5" : "classic";
});

// Verbatim (abridged) from what transformers 5.17 save_pretrained wrote for a tiny deepseek_v3.
TEST(ModelConfig, Transformers5DeepseekV3Verbatim) {
  ModelConfig c = parse(Json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "dtype": "float32",
    "first_k_dense_replace": 1, "head_dim": 8, "hidden_size": 64, "intermediate_size": 128,
    "kv_lora_rank": 16, "max_position_embeddings": 128, "model_type": "deepseek_v3",
    "moe_intermediate_size": 32, "n_group": 2, "n_routed_experts": 4, "n_shared_experts": 1,
    "norm_topk_prob": true, "num_attention_heads": 4, "num_experts_per_tok": 2,
    "num_hidden_layers": 3, "num_key_value_heads": 2, "q_lora_rank": 32, "qk_head_dim": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-06, "rope_interleave": true,
    "rope_parameters": {"beta_fast": 32, "beta_slow": 1, "factor": 4.0, "mscale": 1.0,
      "mscale_all_dim": 1.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0,
      "rope_type": "yarn", "type": "yarn"},
    "routed_scaling_factor": 2.5, "tie_word_embeddings": false, "topk_group": 1,
    "v_head_dim": 16, "vocab_size": 256})"));
  EXPECT_EQ(c.head_dim, 16);  // qk_nope + qk_rope, not transformers' head_dim = qk_rope
  EXPECT_EQ(c.dtype, "float32");
  EXPECT_EQ(c.rope.type, RopeType::Yarn);
  EXPECT_EQ(c.topk_method, TopkMethod::NoauxTc);  // V3 default
  EXPECT_EQ(c.scoring_func, ScoringFunc::Sigmoid);
  EXPECT_EQ(c.numMoeLayers(), 2);
}

TEST(ModelConfig, IsMoeLayerQwen) {
  Json j = qwen2MoeClassic();
  j["num_hidden_layers"] = 8;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  ModelConfig c = parse(j);
  // (layer + 1) % 2 == 0 -> 1, 3, 5, 7; layer 3 is forced dense.
  std::vector<int> moe;
  for (int layer = 0; layer < 8; ++layer)
    if (c.isMoeLayer(layer)) moe.push_back(layer);
  EXPECT_EQ(moe, (std::vector<int>{1, 5, 7}));
  EXPECT_FALSE(c.isMoeLayer(-1));
  EXPECT_FALSE(c.isMoeLayer(8));
}

TEST(ModelConfig, IsMoeLayerDeepseek) {
  Json j = deepseekV3Classic();
  j["num_hidden_layers"] = 10;
  j["first_k_dense_replace"] = 2;
  j["moe_layer_freq"] = 3;
  ModelConfig c = parse(j);
  // layer >= 2 and layer % 3 == 0 -> 3, 6, 9
  std::vector<int> moe;
  for (int layer = 0; layer < 10; ++layer)
    if (c.isMoeLayer(layer)) moe.push_back(layer);
  EXPECT_EQ(moe, (std::vector<int>{3, 6, 9}));
}

TEST(ModelConfig, IsMoeLayerMixtralAndDense) {
  ModelConfig mixtral = parse(mixtralClassic());
  for (int layer = 0; layer < 32; ++layer) EXPECT_TRUE(mixtral.isMoeLayer(layer));
  ModelConfig llama = parse(llama3Classic());
  for (int layer = 0; layer < 32; ++layer) EXPECT_FALSE(llama.isMoeLayer(layer));
}

TEST(ModelConfig, ReadsFileOrDirectory) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "tandem_model_config_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << mixtralClassic().dump();
  EXPECT_EQ(readModelConfig(dir).num_experts, 8);
  EXPECT_EQ(readModelConfig(dir / "config.json").source, dir / "config.json");
  std::filesystem::remove_all(dir);
  try {
    readModelConfig(dir);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
}

struct BadConfig {
  const char* name;
  std::function<Json()> make;
  std::vector<const char*> expected;  // substrings of the error text
};

std::vector<BadConfig> badConfigs() {
  auto with = [](Json base, const char* key, Json value) {
    return [base, key, value]() {
      Json j = base;
      j[key] = value;
      return j;
    };
  };
  auto without = [](Json base, const char* key) {
    return [base, key]() {
      Json j = base;
      j.erase(key);
      return j;
    };
  };
  Json q3 = qwen3MoeClassic();
  Json ds = deepseekV3Classic();
  return {
      {"missing_hidden_size", without(q3, "hidden_size"), {"'hidden_size'", "missing"}},
      {"missing_model_type", without(q3, "model_type"), {"'model_type'", "missing"}},
      {"missing_experts", without(q3, "num_experts"), {"'num_experts'", "missing"}},
      {"missing_kv_lora_rank", without(ds, "kv_lora_rank"), {"'kv_lora_rank'"}},
      {"string_size", with(q3, "hidden_size", "2048"), {"'hidden_size'", "integer"}},
      {"float_size", with(q3, "num_hidden_layers", 2.5), {"'num_hidden_layers'", "integer"}},
      {"bool_as_string",
       with(q3, "tie_word_embeddings", "no"),
       {"'tie_word_embeddings'", "true or false"}},
      {"list_type", with(q3, "mlp_only_layers", "0,1"), {"'mlp_only_layers'", "list"}},
      {"zero_layers", with(q3, "num_hidden_layers", 0), {"'num_hidden_layers'", "positive"}},
      {"negative_vocab", with(q3, "vocab_size", -5), {"'vocab_size'", "positive"}},
      {"zero_experts", with(q3, "num_experts", 0), {"'num_experts'", "positive"}},
      {"indivisible_heads",
       [] {
         Json j = mixtralClassic();
         j["hidden_size"] = 4000;
         j["num_attention_heads"] = 48;
         j["num_key_value_heads"] = 8;
         return j;
       },
       {"'hidden_size'", "not divisible", "head_dim"}},
      {"kv_heads_do_not_divide",
       with(q3, "num_key_value_heads", 5),
       {"'num_key_value_heads'", "divide"}},
      {"topk_above_experts",
       with(q3, "num_experts_per_tok", 129),
       {"'num_experts_per_tok'", "larger"}},
      {"topk_group_above_n_group", with(ds, "topk_group", 9), {"'topk_group'", "n_group"}},
      {"experts_not_divisible_by_groups",
       with(ds, "n_group", 7),
       {"'n_routed_experts'", "n_group"}},
      {"unsupported_model_type",
       with(q3, "model_type", "gpt_oss"),
       {"'model_type'", "gpt_oss", "qwen3_moe", "deepseek_v3", "mixtral", "llama"}},
      {"unknown_rope_type",
       with(llama3Classic(), "rope_scaling", Json{{"rope_type", "ntk_magic"}, {"factor", 2.0}}),
       {"'rope_scaling.rope_type'", "ntk_magic", "yarn"}},
      {"unknown_rope_type_v5",
       with(q3, "rope_parameters", Json{{"rope_type", "weird"}}),
       {"'rope_parameters.rope_type'", "weird"}},
      {"rope_not_object", with(q3, "rope_scaling", 3), {"'rope_scaling'", "object"}},
      {"bad_scoring_func", with(ds, "scoring_func", "relu"), {"'scoring_func'", "relu"}},
      {"bad_topk_method", with(ds, "topk_method", "beam"), {"'topk_method'", "beam"}},
      {"quant_without_method",
       with(ds, "quantization_config", Json{{"fmt", "e4m3"}}),
       {"'quantization_config.quant_method'"}},
  };
}

TEST(ModelConfig, BadConfigsGiveTheIntendedError) {
  for (const BadConfig& bad : badConfigs()) {
    SCOPED_TRACE(bad.name);
    try {
      parseModelConfig(bad.make().dump(), "/models/x/config.json");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      std::string text = e.what();
      EXPECT_NE(text.find("/models/x/config.json"), std::string::npos) << text;
      for (const char* expected : bad.expected) {
        EXPECT_NE(text.find(expected), std::string::npos)
            << "'" << expected << "' not in: " << text;
      }
    }
  }
}

TEST(ModelConfig, UnparseableJson) {
  for (const char* text : {"{\"model_type\": \"llama\",", "", "[1, 2]", "not json"}) {
    SCOPED_TRACE(text);
    try {
      parseModelConfig(text, "cfg.json");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tandem::io

namespace tandem::io {
namespace {

Json with(Json base, const char* key, Json value) {
  base[key] = std::move(value);
  return base;
}

std::string configError(const std::string& text) {
  try {
    parseModelConfig(text, "config.json");
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

TEST(ModelConfig, HostileValuesGiveAnErrorNotACrash) {
  // 100k levels deep: parsed fine, then dump() of the bad value overflowed the stack.
  const Json base = qwen3MoeClassic();
  Json no_size = base;
  no_size.erase("hidden_size");
  std::string text = no_size.dump();
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  text.insert(1, "\"hidden_size\": " + deep + ", ");
  EXPECT_NE(configError(text).find("nested more than"), std::string::npos);
  // A quoted value is cut to an excerpt.
  const std::string long_text =
      configError(with(base, "hidden_size", std::string(100000, 'x')).dump());
  EXPECT_NE(long_text.find("'hidden_size'"), std::string::npos) << long_text;
  EXPECT_LT(long_text.size(), 1000u);
  // Converting 1e300 to an integer is undefined behaviour; it is "not an integer".
  EXPECT_NE(configError(with(base, "hidden_size", 1e300).dump()).find("'hidden_size'"),
            std::string::npos);
  // Two huge head dims overflowed their sum.
  Json ds = deepseekV3Classic();
  ds["qk_nope_head_dim"] = int64_t{1} << 62;
  ds["qk_rope_head_dim"] = int64_t{1} << 62;
  EXPECT_NE(configError(ds.dump()).find("qk_"), std::string::npos);
}

}  // namespace
}  // namespace tandem::io
