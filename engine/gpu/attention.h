#pragma once
// Self-attention of the target architectures, on the layer's torch device:
//   GqaAttention: llama, qwen2 (q/k/v bias), qwen3 (per-head q/k RMSNorm), mixtral, qwen*_moe.
//   MlaAttention: DeepSeek-V2/V3 multi-head latent attention (low-rank q and kv, a shared rope
//   key).
// Both are causal. Batches are right-padded, so real tokens never attend to padding and
// no padding mask is needed.

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "engine/gpu/lora_linear.h"
#include "engine/gpu/rope.h"

namespace tandem::gpu {

struct SequenceSegments;  // segmented_attention.h

// q [B, heads, S, dk], k [B, kv_heads, S, dk], v [B, kv_heads, S, dv] -> [B, S, heads * dv].
// Through torch's scaled_dot_product_attention with is_causal, on a kernel that never builds the
// [S, S] scores where torch has one for the shapes (docs/long_context.md says which runs where):
// v is zero-padded to dk when only that lets one take MLA's dv < dk, and k/v are not copied per
// query head where the kernel reads the groups itself. On a GPU, more than 4096 tokens that only
// the math path would take are an Error rather than an [S, S] allocation.
at::Tensor causalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scaling);
// The kernel causalAttention runs for these inputs: "flash", "efficient", "cudnn" or "math".
std::string causalAttentionKernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  double scaling);

// Calls f(name, linear) for each projection, with the HF leaf name (q_proj, ...).
using ProjectionVisitor = std::function<void(const std::string& leaf, LoraLinear& linear)>;

struct GqaAttention {
  LoraLinear q_proj, k_proj, v_proj, o_proj;
  at::Tensor q_norm, k_norm;  // [head_dim], qwen3 only
  int num_heads = 0;
  int num_kv_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double scaling = 1.0;  // head_dim^-0.5

  // x [B, S, hidden] -> [B, S, hidden]. segments (may be null): packed samples that must not
  // attend to each other (segmentedCausalAttention); rope then holds their per-row positions.
  at::Tensor forward(const at::Tensor& x, const RopeTables& rope, bool training,
                     const SequenceSegments* segments = nullptr) const;
  void visitProjections(const ProjectionVisitor& visit);
};

struct MlaAttention {
  LoraLinear q_proj;              // when q_lora_rank is absent (V2-Lite)
  LoraLinear q_a_proj, q_b_proj;  // when it is present
  at::Tensor q_a_layernorm;       // [q_lora_rank]
  LoraLinear kv_a_proj_with_mqa;  // hidden -> kv_lora_rank + rope dim
  at::Tensor kv_a_layernorm;      // [kv_lora_rank]
  LoraLinear kv_b_proj;           // kv_lora_rank -> heads * (nope + v)
  LoraLinear o_proj;
  int num_heads = 0;
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  double rms_norm_eps = 1e-6;
  double scaling = 1.0;  // (nope + rope)^-0.5, times yarn's mscale² when it applies
  RopeLayout rope_layout = RopeLayout::Interleaved;

  // As GqaAttention::forward, segments included.
  at::Tensor forward(const at::Tensor& x, const RopeTables& rope, bool training,
                     const SequenceSegments* segments = nullptr) const;
  void visitProjections(const ProjectionVisitor& visit);
};

}  // namespace tandem::gpu
