#include "engine/gpu/attention.h"

#include <ATen/ATen.h>

#include <string>

#include "engine/core/error.h"
#include "engine/gpu/norm.h"
#include "engine/gpu/segmented_attention.h"

namespace tandem::gpu {

namespace {

// torch's SDPBackend numbering (at::_fused_sdp_choice): 0 is the math path, the one that builds
// the [S, S] score matrix; the others (flash, memory-efficient, cuDNN; flash on the CPU) never
// hold more than a tile of it.
constexpr int64_t kSdpMath = 0;
// Above this many tokens the math path's scores ([B, heads, S, S] fp32, and their softmax and
// gradient) are refused on a GPU: 4096² · 4 bytes is 64 MiB per head already.
constexpr int64_t kMathPathMaxTokens = 4096;

int64_t sdpChoice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scaling,
                  bool gqa) {
  return at::_fused_sdp_choice(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                               scaling, gqa);
}

// repeat_kv: each key/value head serves `groups` query heads.
at::Tensor repeatHeads(const at::Tensor& t, int64_t groups) {
  if (groups == 1) return t;
  return t.unsqueeze(2)
      .expand({t.size(0), t.size(1), groups, t.size(2), t.size(3)})
      .reshape({t.size(0), t.size(1) * groups, t.size(2), t.size(3)});
}

struct AttentionPlan {
  bool pad_value = false;   // v zero-padded to q/k's head dim, the output sliced back
  bool native_gqa = false;  // SDPA's enable_gqa: k and v are not copied per query head
  int64_t backend = kSdpMath;
};

// Asks torch which kernel each variant would get, without building the variants: a padded v has
// k's shape, and a query with kv_heads heads stands for the repeated k and v.
AttentionPlan planAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scaling) {
  const int64_t groups = q.size(1) / k.size(1);
  AttentionPlan plan;
  // MLA: v's head dim (128) below q/k's (192). Flash kernels (CUDA and CPU) want one head dim;
  // when no fused kernel takes the shapes as they are (on the CPU), v is padded with zeros to
  // q/k's, which adds zero columns to the output and nothing else.
  if (v.size(-1) < q.size(-1) && sdpChoice(q, k, v, scaling, groups > 1) == kSdpMath) {
    plan.pad_value = true;
  }
  const at::Tensor value = plan.pad_value ? k : v;
  // Grouped-query attention reads the groups itself in the flash kernels; the memory-efficient
  // one does not, so it gets copies (repeat_kv).
  plan.native_gqa = groups > 1 && sdpChoice(q, k, value, scaling, true) != kSdpMath;
  plan.backend = plan.native_gqa ? sdpChoice(q, k, value, scaling, true)
                                 : sdpChoice(q.narrow(1, 0, k.size(1)), k, value, scaling, false);
  return plan;
}

}  // namespace

std::string causalAttentionKernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  double scaling) {
  switch (planAttention(q, k, v, scaling).backend) {
    case 0: return "math";
    case 1: return "flash";
    case 2: return "efficient";
    case 3: return "cudnn";
    default: return "other";
  }
}

at::Tensor causalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scaling) {
  const AttentionPlan plan = planAttention(q, k, v, scaling);
  const int64_t seq = q.size(2), dv = v.size(-1);
  if (plan.backend == kSdpMath && !q.is_cpu() && seq > kMathPathMaxTokens) {
    throw Error("attention over " + std::to_string(seq) +
                    " tokens has no fused kernel for these shapes (head dims " +
                    std::to_string(q.size(-1)) + "/" + std::to_string(dv) + ", " +
                    c10::toString(q.scalar_type()) + "): torch's math path would build the [" +
                    std::to_string(seq) + " x " + std::to_string(seq) + "] score matrix",
                "train in bf16 (flash and memory-efficient kernels), or with a shorter cutoff_len");
  }
  const int64_t groups = q.size(1) / k.size(1);
  at::Tensor value = plan.pad_value ? at::constant_pad_nd(v, {0, q.size(-1) - dv}) : v;
  const at::Tensor key = plan.native_gqa ? k : repeatHeads(k, groups);
  if (!plan.native_gqa) value = repeatHeads(value, groups);
  at::Tensor out =
      at::scaled_dot_product_attention(q, key, value, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                       /*is_causal=*/true, scaling, /*enable_gqa=*/plan.native_gqa);
  if (plan.pad_value) out = out.narrow(-1, 0, dv);
  // [B, heads, S, dv] -> [B, S, heads * dv]
  return out.transpose(1, 2).reshape({q.size(0), q.size(2), -1});
}

at::Tensor GqaAttention::forward(const at::Tensor& x, const RopeTables& rope, bool training,
                                 const SequenceSegments* segments) const {
  const int64_t batch = x.size(0), seq = x.size(1);
  auto heads = [&](const LoraLinear& proj, int n, const at::Tensor& norm) {
    at::Tensor t = proj.forward(x, training).view({batch, seq, n, head_dim});
    if (norm.defined()) t = rmsNorm(t, norm, rms_norm_eps);  // qwen3: per head, before rope
    return t.transpose(1, 2);                                // [B, n, S, head_dim]
  };
  const at::Tensor q = Rope::apply(heads(q_proj, num_heads, q_norm), rope, RopeLayout::Halves);
  const at::Tensor k = Rope::apply(heads(k_proj, num_kv_heads, k_norm), rope, RopeLayout::Halves);
  const at::Tensor v = heads(v_proj, num_kv_heads, at::Tensor());
  const at::Tensor attended = segments ? segmentedCausalAttention(q, k, v, scaling, *segments)
                                       : causalAttention(q, k, v, scaling);
  return o_proj.forward(attended, training);
}

void GqaAttention::visitProjections(const ProjectionVisitor& visit) {
  visit("q_proj", q_proj);
  visit("k_proj", k_proj);
  visit("v_proj", v_proj);
  visit("o_proj", o_proj);
}

at::Tensor MlaAttention::forward(const at::Tensor& x, const RopeTables& rope, bool training,
                                 const SequenceSegments* segments) const {
  const int64_t batch = x.size(0), seq = x.size(1);
  const int64_t qk_head_dim = qk_nope_head_dim + qk_rope_head_dim;
  at::Tensor q =
      q_proj.defined()
          ? q_proj.forward(x, training)
          : q_b_proj.forward(rmsNorm(q_a_proj.forward(x, training), q_a_layernorm, rms_norm_eps),
                             training);
  q = q.view({batch, seq, num_heads, qk_head_dim}).transpose(1, 2);  // [B, heads, S, qk]
  const at::Tensor q_nope = q.narrow(-1, 0, qk_nope_head_dim);
  const at::Tensor q_rope = q.narrow(-1, qk_nope_head_dim, qk_rope_head_dim);

  const at::Tensor compressed = kv_a_proj_with_mqa.forward(x, training);
  const at::Tensor kv_latent =
      rmsNorm(compressed.narrow(-1, 0, kv_lora_rank), kv_a_layernorm, rms_norm_eps);
  // The rope key is one head shared by all query heads: [B, 1, S, rope].
  const at::Tensor k_rope_shared =
      compressed.narrow(-1, kv_lora_rank, qk_rope_head_dim).view({batch, 1, seq, qk_rope_head_dim});

  const at::Tensor q_rot = Rope::apply(q_rope, rope, rope_layout);
  const at::Tensor k_rot = Rope::apply(k_rope_shared, rope, rope_layout);

  const at::Tensor kv = kv_b_proj.forward(kv_latent, training)
                            .view({batch, seq, num_heads, qk_nope_head_dim + v_head_dim})
                            .transpose(1, 2);  // [B, heads, S, nope + v]
  const at::Tensor k_nope = kv.narrow(-1, 0, qk_nope_head_dim);
  const at::Tensor value = kv.narrow(-1, qk_nope_head_dim, v_head_dim);
  const at::Tensor key =
      at::cat({k_nope, k_rot.expand({batch, num_heads, seq, qk_rope_head_dim})}, -1);
  const at::Tensor query = at::cat({q_nope, q_rot}, -1);
  const at::Tensor attended = segments
                                  ? segmentedCausalAttention(query, key, value, scaling, *segments)
                                  : causalAttention(query, key, value, scaling);
  return o_proj.forward(attended, training);
}

void MlaAttention::visitProjections(const ProjectionVisitor& visit) {
  if (q_proj.defined()) visit("q_proj", q_proj);
  if (q_a_proj.defined()) visit("q_a_proj", q_a_proj);
  if (q_b_proj.defined()) visit("q_b_proj", q_b_proj);
  visit("kv_a_proj_with_mqa", kv_a_proj_with_mqa);
  visit("kv_b_proj", kv_b_proj);
  visit("o_proj", o_proj);
}

}  // namespace tandem::gpu
