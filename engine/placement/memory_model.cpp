#include "engine/placement/memory_model.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/placement/expert_format.h"
#include "engine/placement/memory_planner.h"

namespace tandem::placement::memory {

namespace {

using io::Architecture;
using io::ModelConfig;

// Routed expert width: Mixtral's experts are intermediate_size wide, the others
// moe_intermediate_size.
int64_t expertWidth(const ModelConfig& m) {
  return m.architecture == Architecture::Mixtral ? m.intermediate_size : m.moe_intermediate_size;
}

int64_t sharedWidth(const ModelConfig& m) {
  if (m.architecture == Architecture::Qwen2Moe) return m.shared_expert_intermediate_size;
  if (m.architecture == Architecture::DeepseekV2 || m.architecture == Architecture::DeepseekV3) {
    return m.n_shared_experts * m.moe_intermediate_size;
  }
  return 0;
}

struct Linear {
  const char* leaf;
  int64_t in, out;
};

// The LoRA-capable linears of an attention block, as engine/gpu/attention.cpp builds them.
std::vector<Linear> attentionLinears(const ModelConfig& m) {
  const int64_t H = m.hidden_size, nh = m.num_attention_heads;
  if (m.isMla()) {
    const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    std::vector<Linear> out;
    if (m.q_lora_rank) {
      out.push_back({"q_a_proj", H, *m.q_lora_rank});
      out.push_back({"q_b_proj", *m.q_lora_rank, nh * qk});
    } else {
      out.push_back({"q_proj", H, nh * qk});
    }
    out.push_back({"kv_a_proj_with_mqa", H, m.kv_lora_rank + m.qk_rope_head_dim});
    out.push_back({"kv_b_proj", m.kv_lora_rank, nh * (m.qk_nope_head_dim + m.v_head_dim)});
    out.push_back({"o_proj", nh * m.v_head_dim, H});
    return out;
  }
  const int64_t hd = m.head_dim, nkv = m.num_key_value_heads;
  return {{"q_proj", H, nh * hd},
          {"k_proj", H, nkv * hd},
          {"v_proj", H, nkv * hd},
          {"o_proj", nh * hd, H}};
}

std::vector<Linear> mlpLinears(int64_t H, int64_t I) {
  return {{"gate_proj", H, I}, {"up_proj", H, I}, {"down_proj", I, H}};
}

}  // namespace

int64_t moduleParameters(const ModelConfig& m, ModuleKind kind) {
  const int64_t H = m.hidden_size;
  switch (kind) {
    case ModuleKind::Embedding: return m.vocab_size * H;
    case ModuleKind::LmHead: return m.tie_word_embeddings ? 0 : m.vocab_size * H;
    case ModuleKind::FinalNorm: return H;
    case ModuleKind::Attention: {
      int64_t n = 2 * H;  // input_layernorm + post_attention_layernorm travel with the attention
      for (const Linear& l : attentionLinears(m)) n += l.in * l.out;
      if (m.isMla())
        n += m.kv_lora_rank + (m.q_lora_rank ? *m.q_lora_rank : 0);  // kv_a / q_a norms
      if (m.attention_bias && !m.isMla())
        n += (m.num_attention_heads + 2 * m.num_key_value_heads) * m.head_dim;
      if (m.qk_norm) n += 2 * m.head_dim;
      return n;
    }
    case ModuleKind::Router:
      // [E, H] (+ DeepSeek-V3's e_score_correction_bias [E]).
      return m.num_experts * H + (m.architecture == Architecture::DeepseekV3 ? m.num_experts : 0);
    case ModuleKind::SharedExperts:
      return 3 * H * sharedWidth(m) +
             (m.architecture == Architecture::Qwen2Moe ? H : 0);  // + shared_expert_gate
    case ModuleKind::DenseMlp: return 3 * H * m.intermediate_size;
    case ModuleKind::RoutedExperts: return int64_t{m.num_experts} * 3 * H * expertWidth(m);
  }
  return 0;
}

uint64_t routedExpertBytes(const ModelConfig& m, const std::string& format, int layer) {
  if (format == m.stored_expert_format && layer >= 0 &&
      static_cast<size_t>(layer) < m.stored_expert_layer_bytes.size() &&
      m.stored_expert_layer_bytes[static_cast<size_t>(layer)] > 0) {
    return m.stored_expert_layer_bytes[static_cast<size_t>(layer)];
  }
  const int64_t E = m.num_experts, H = m.hidden_size, I = expertWidth(m);
  const ExpertFormat f = expertFormat(format);
  // gate and up [I, H], down [H, I], each with its blocks along its input dimension.
  return static_cast<uint64_t>(E) * (2 * f.matrixBytes(I, H) + f.matrixBytes(H, I));
}

std::string gpuExpertFormat(const std::string& weight_format, bool bf16) {
  if (weight_format == "int8" || weight_format.starts_with("int4")) return weight_format;
  return bf16 ? "bf16" : "fp32";
}

uint64_t splitHostCopyBytes(const ModelConfig& m, const std::string& weight_format, bool bf16) {
  const std::string format = gpuExpertFormat(weight_format, bf16);
  const ExpertFormat f = expertFormat(format);
  const auto E = static_cast<uint64_t>(std::max<int64_t>(m.num_experts, 1));
  const auto H = static_cast<uint64_t>(m.hidden_size), I = static_cast<uint64_t>(expertWidth(m));
  auto aligned = [](uint64_t bytes) { return (bytes + 255) / 256 * 256; };  // kHostBlockAlignment
  if (format == "int8")  // int8 values, then the fp32 row scales: tensors of their own
    return 2 * aligned(E * I * H) + aligned(E * H * I) + 2 * aligned(E * I * 4) +
           aligned(E * H * 4);
  const int64_t h = m.hidden_size, i = expertWidth(m);
  return 2 * aligned(E * f.matrixBytes(i, h)) + aligned(E * f.matrixBytes(h, i));
}

uint64_t residentExpertBytes(const ModelConfig& m, const std::string& weight_format, bool bf16) {
  return routedExpertBytes(m, gpuExpertFormat(weight_format, bf16)) /
         static_cast<uint64_t>(std::max<int64_t>(m.num_experts, 1));
}

int64_t loraParameters(const ModelConfig& m, ModuleKind kind, int layer,
                       const io::LoraTarget& target, int rank) {
  if (rank <= 0) return 0;
  const std::string prefix = "model.layers." + std::to_string(layer) + ".";
  auto sum = [&](const std::vector<Linear>& linears, const std::string& module) {
    int64_t n = 0;
    for (const Linear& l : linears) {
      if (target.matches(module + l.leaf)) n += rank * (l.in + l.out);
    }
    return n;
  };
  switch (kind) {
    case ModuleKind::Attention: return sum(attentionLinears(m), prefix + "self_attn.");
    case ModuleKind::DenseMlp:
      return sum(mlpLinears(m.hidden_size, m.intermediate_size), prefix + "mlp.");
    case ModuleKind::SharedExperts: {
      const bool qwen2 = m.architecture == Architecture::Qwen2Moe;
      int64_t n = sum(mlpLinears(m.hidden_size, sharedWidth(m)),
                      prefix + (qwen2 ? "mlp.shared_expert." : "mlp.shared_experts."));
      if (qwen2 && target.matches(prefix + "mlp.shared_expert_gate"))
        n += rank * (m.hidden_size + 1);
      return n;
    }
    case ModuleKind::Router:
      return target.matches(prefix + "mlp.gate") ? rank * (m.hidden_size + m.num_experts) : 0;
    case ModuleKind::RoutedExperts:
      return m.num_experts *
             sum(mlpLinears(m.hidden_size, expertWidth(m)), prefix + "mlp.experts.");
    case ModuleKind::LmHead:
      return target.matches("lm_head") && !m.tie_word_embeddings
                 ? rank * (m.hidden_size + m.vocab_size)
                 : 0;
    case ModuleKind::Embedding:
    case ModuleKind::FinalNorm: return 0;
  }
  return 0;
}

uint64_t expertForwardCacheBytes(const ModelConfig& m, int64_t tokens, int64_t act_bytes,
                                 int lora_rank, int nodes) {
  const int64_t P = tokens * m.num_experts_per_tok;
  return static_cast<uint64_t>(tokens * m.hidden_size * act_bytes + P * 4 +
                               2 * P * expertWidth(m) * 4 + nodes * P * 3 * int64_t{lora_rank} * 4 +
                               (m.num_experts + 1) * 8 + 2 * P * 8);
}

uint64_t expertScratchBytes(const ModelConfig& m, int64_t tokens, int rank,
                            int targeted_projections, bool down_targeted, int nodes) {
  const int64_t P = tokens * m.num_experts_per_tok, H = m.hidden_size, I = expertWidth(m);
  const int64_t forward = nodes * P * H * 4;
  const int64_t backward =
      (nodes * P * H + (down_targeted ? P * I : 0) +
       nodes * int64_t{targeted_projections} * P * rank + (nodes > 1 ? nodes * P : 0)) *
      4;
  return static_cast<uint64_t>(std::max(forward, backward));
}

namespace {

// Tokens a (dense or shared-expert) MLP's products span at once: its chunk, or every token.
int64_t mlpSpan(int64_t tokens, int64_t chunk_tokens) {
  return chunk_tokens > 0 ? std::min(tokens, chunk_tokens) : tokens;
}

}  // namespace

uint64_t layerActivationBytes(const ModelConfig& m, int layer, int64_t tokens, int64_t act_bytes,
                              int64_t mlp_chunk_tokens, bool shared_in_chunks) {
  const int64_t H = m.hidden_size, nh = m.num_attention_heads;
  // Attention: the norm's input and output, q, k, v before and after rope, the attention output
  // (and its f32 log-sum-exp per head), the o_proj input; MLA adds the compressed q/kv and their
  // norms.
  int64_t attention = 2 * H;
  if (m.isMla()) {
    const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    attention += 2 * nh * qk + nh * qk + nh * m.v_head_dim * 2 +
                 2 * (m.kv_lora_rank + m.qk_rope_head_dim) +
                 (m.q_lora_rank ? 2 * *m.q_lora_rank : 0);
  } else {
    const int64_t q = nh * m.head_dim, kv = m.num_key_value_heads * m.head_dim;
    attention += 2 * (q + 2 * kv) + 2 * q;
  }
  int64_t mlp = 2 * H;  // post-attention norm input and output
  // gate, up and their product: per token, or (in chunks) one chunk's, recomputed per chunk.
  int64_t mlp_products = 0;
  if (m.isMoeLayer(layer)) {
    // router logits and probabilities in f32 (counted in b units), the routed output, the shared
    // experts' output; their products.
    mlp += 2 * m.num_experts * 4 / act_bytes + H + H;
    mlp_products = mlpSpan(tokens, shared_in_chunks ? mlp_chunk_tokens : 0) * 3 * sharedWidth(m);
  } else {
    mlp += H;
    mlp_products = mlpSpan(tokens, mlp_chunk_tokens) * 3 * m.intermediate_size;
  }
  return static_cast<uint64_t>((tokens * (attention + mlp) + mlp_products) * act_bytes +
                               tokens * nh * 4);
}

uint64_t lossActivationBytes(const ModelConfig& m, int64_t tokens, int64_t loss_chunk_tokens,
                             int64_t act_bytes) {
  const int64_t rows = std::min(tokens, loss_chunk_tokens);
  return static_cast<uint64_t>(3 * rows * m.vocab_size * 4 +
                               2 * tokens * m.hidden_size * act_bytes);
}

int64_t moeChunkTokens(int64_t tokens, int64_t moe_token_chunk) {
  const int64_t chunk = moe_token_chunk > 0 ? moe_token_chunk : kAutoMoeTokenChunk;
  return std::max<int64_t>(1, std::min(tokens, chunk));
}

uint64_t layerBackwardBytes(const ModelConfig& m, int layer, int64_t tokens, int64_t chunk_tokens,
                            int64_t act_bytes, bool shared_in_chunks) {
  const int64_t H = m.hidden_size, nh = m.num_attention_heads;
  // Widths per token of the attention kernel's q, k, v and output as causalAttention gets them.
  int64_t q = 0, k = 0, v = 0, extra_saved = 0;
  if (m.isMla()) {
    const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    q = nh * qk;
    k = nh * qk;
    v = nh * std::max(qk, m.v_head_dim);  // padded to the q/k head dim for the fused kernels
    // The padded v and the kernel's padded output, beside the narrowed ones already counted.
    extra_saved = m.v_head_dim < qk ? 2 * nh * (qk - m.v_head_dim) : 0;
  } else {
    const int64_t groups = nh / std::max(m.num_key_value_heads, 1);
    q = nh * m.head_dim;
    k = v = nh * m.head_dim;
    // repeat_kv materialises K and V for every query head (expand + reshape copies).
    extra_saved = groups > 1 ? 2 * nh * m.head_dim : 0;
  }
  // dy and dx of the layer, dq / dk / dv, dO, and the fp32 dq accumulator of the kernel.
  const int64_t attention = 2 * H + q + k + v + v + extra_saved;
  // The output gradient(s) per token, and gate/up's gradients over the MLP's span: the routed
  // output's and the input's with the shared experts' in a MoE layer, the dense MLP's otherwise.
  int64_t mlp = 0, mlp_grads = 0;
  if (m.isMoeLayer(layer)) {
    mlp = H + H;
    mlp_grads = mlpSpan(tokens, shared_in_chunks ? chunk_tokens : 0) * 2 * sharedWidth(m);
  } else {
    mlp = H;
    mlp_grads = mlpSpan(tokens, chunk_tokens) * 2 * m.intermediate_size;
  }
  const int64_t router = m.isMoeLayer(layer) ? 2 * chunk_tokens * m.num_experts * 4 : 0;
  return static_cast<uint64_t>((tokens * (attention + mlp) + mlp_grads) * act_bytes +
                               tokens * q * 4 + router);
}

uint64_t kvCacheBytes(const ModelConfig& m, int64_t tokens, int64_t act_bytes) {
  const int64_t per_token =
      m.isMla() ? m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
                : 2 * m.num_key_value_heads * m.head_dim;
  return static_cast<uint64_t>(tokens * per_token * act_bytes);
}

}  // namespace tandem::placement::memory
