#pragma once
// Two-layer MoE configs small enough for a test to build, run and train in milliseconds.

#include <string>

#include "engine/io/model_config.h"

namespace tandem::model::testing {

inline io::ModelConfig tinyQwen3MoeConfig(int num_experts) {
  return io::parseModelConfig(R"({"architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "num_experts": )" + std::to_string(num_experts) +
                                  R"(, "num_experts_per_tok": 2, "norm_topk_prob": true,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 64, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false, "dtype": "float32"})",
                              "test config");
}

// Two Qwen2-MoE layers, each with a shared expert beside 6 routed ones (top 2).
inline io::ModelConfig tinyQwen2MoeConfig() {
  return io::parseModelConfig(R"({
  "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 48,
  "intermediate_size": 64, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 32,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 6,
  "num_experts_per_tok": 2, "norm_topk_prob": false, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "vocab_size": 64, "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "dtype": "float32"})",
                              "test config");
}

}  // namespace tandem::model::testing
