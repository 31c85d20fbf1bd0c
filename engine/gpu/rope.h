#pragma once
// Rotary position embeddings as transformers computes them (modeling_rope_utils.py): the inverse
// frequencies for the rope types our architectures use (default, linear, yarn, llama3; dynamic
// within the trained context), the cos/sin tables, and the two layouts that apply them.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "engine/io/model_config.h"

namespace tandem::gpu {

// How the rotary dims pair up: llama/qwen/mixtral rotate the two halves of the head;
// DeepSeek pairs neighbours (x0, x1), (x2, x3), ... (its checkpoints are laid out that way).
enum class RopeLayout { Halves, Interleaved };

struct RopeTables {
  // [seq, rotary_dim / 2] fp32, already times the attention scaling; [batch, seq, rotary_dim / 2]
  // when each row has its own positions (packed samples restarting at 0).
  at::Tensor cos;
  at::Tensor sin;
};

class Rope {
 public:
  Rope() = default;
  // rotary_dim: head_dim (GQA) or qk_rope_head_dim (MLA).
  Rope(const io::ModelConfig& config, int64_t rotary_dim);

  // Positions 0 .. seq_len-1 on `device`.
  RopeTables tables(int64_t seq_len, const at::Device& device) const;
  // Positions given per token: position_ids [batch, seq] int64 (CPU) -> tables [batch, seq, .].
  RopeTables tables(const at::Tensor& position_ids, const at::Device& device) const;

  // x [batch, heads, seq, rotary_dim]; computed in fp32 and cast back to x's dtype.
  static at::Tensor apply(const at::Tensor& x, const RopeTables& tables, RopeLayout layout);

  double attentionScaling() const { return attention_scaling_; }
  const at::Tensor& invFreq() const { return inv_freq_; }

 private:
  at::Tensor inv_freq_;  // [rotary_dim / 2] fp32, CPU
  double attention_scaling_ = 1.0;
  int64_t max_position_embeddings_ = 0;
  io::RopeType type_ = io::RopeType::Default;
};

}  // namespace tandem::gpu
