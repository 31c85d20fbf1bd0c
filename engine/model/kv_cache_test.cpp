// KV-cached inference (prefill, then one token at a time, and a chunk after a truncated cache)
// gives the logits of the full no-cache forward, for every attention and MLP kind.

#include "engine/model/kv_cache.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/io/model_config.h"
#include "engine/model/causal_lm.h"

namespace tandem::model {
namespace {

const char* kCommon = R"("hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96, "max_position_embeddings": 64,
  "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false)";

std::string config(const std::string& model_type, const std::string& extra) {
  return std::string("{\"model_type\": \"") + model_type + "\", " + kCommon +
         (extra.empty() ? "" : ", " + extra) + "}";
}

struct Case {
  const char* name;
  std::string json;
};

std::vector<Case> cases() {
  const std::string mla =
      R"("moe_intermediate_size": 24, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16, "v_head_dim": 16, "n_group": 4, "topk_group": 2, "num_key_value_heads": 4,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707})";
  return {
      {"llama", config("llama", R"("head_dim": 16)")},
      {"qwen2", config("qwen2", R"("head_dim": 16)")},
      {"qwen3", config("qwen3", R"("head_dim": 16)")},
      {"qwen3_moe",
       config("qwen3_moe", R"("head_dim": 16, "moe_intermediate_size": 24, "num_experts": 8,
        "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [])")},
      {"qwen2_moe",
       config("qwen2_moe",
              R"("moe_intermediate_size": 24, "num_experts": 8, "num_experts_per_tok": 2,
        "shared_expert_intermediate_size": 40, "decoder_sparse_step": 1, "mlp_only_layers": [])")},
      {"mixtral",
       config("mixtral", R"("head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2)")},
      {"deepseek_v2",
       config("deepseek_v2",
              mla + R"(, "q_lora_rank": null, "topk_method": "group_limited_greedy")")},
      {"deepseek_v3", config("deepseek_v3", mla + R"(, "q_lora_rank": 32, "norm_topk_prob": true,
        "routed_scaling_factor": 2.5)")},
  };
}

double relativeError(const at::Tensor& got, const at::Tensor& want) {
  return ((got - want).norm() / want.norm()).item<double>();
}

class KvCacheTest : public ::testing::TestWithParam<size_t> {};

TEST_P(KvCacheTest, CachedDecodeGivesTheFullForwardLogits) {
  const Case c = cases()[GetParam()];
  SCOPED_TRACE(c.name);
  const io::ModelConfig config = io::parseModelConfig(c.json, c.name);
  auto model = CausalLm::random(config, ModelOptions{}, nullptr, /*seed=*/7, ThreadPool::global());
  at::NoGradGuard no_grad;
  const int64_t total = 11, prompt = 6;
  const at::Tensor ids =
      at::randint(config.vocab_size, {1, total}, at::TensorOptions().dtype(at::kLong));
  const at::Tensor full = model->logits(model->forwardHidden(ids, false));  // [1, total, vocab]

  KvCache cache(config.num_hidden_layers, 1, total);
  at::Tensor prefill = model->logits(model->forwardCached(ids.narrow(1, 0, prompt), cache));
  EXPECT_LT(relativeError(prefill, full.narrow(1, 0, prompt)), 1e-5);
  for (int64_t t = prompt; t < total; ++t) {
    const at::Tensor step = model->logits(model->forwardCached(ids.narrow(1, t, 1), cache));
    EXPECT_LT(relativeError(step, full.narrow(1, t, 1)), 1e-4) << "position " << t;
  }
  EXPECT_EQ(cache.length(), total);

  // Keep a 4-token prefix and feed the rest as one chunk: the masked cached path.
  cache.truncate(4);
  const at::Tensor chunk = model->logits(model->forwardCached(ids.narrow(1, 4, total - 4), cache));
  EXPECT_LT(relativeError(chunk, full.narrow(1, 4, total - 4)), 1e-4);
  EXPECT_THROW(model->forwardCached(ids.narrow(1, 0, 1), cache), Error);  // the cache is full
}

INSTANTIATE_TEST_SUITE_P(Architectures, KvCacheTest, ::testing::Range<size_t>(0, 8));

}  // namespace
}  // namespace tandem::model
