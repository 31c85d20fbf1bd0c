#include "engine/model/kv_cache.h"

#include <ATen/ATen.h>

#include <limits>
#include <string>

#include "engine/core/error.h"
#include "engine/gpu/norm.h"
#include "engine/model/causal_lm.h"

namespace tandem::model {

KvCache::KvCache(int64_t num_layers, int64_t batch, int64_t capacity)
    : layers_(static_cast<size_t>(num_layers)), batch_(batch), capacity_(capacity) {
  if (batch <= 0 || capacity <= 0) throw Error("a KV cache needs a positive batch and capacity");
}

void KvCache::truncate(int64_t length) {
  if (length < 0 || length > length_) {
    throw Error("cannot truncate a KV cache of " + std::to_string(length_) + " positions to " +
                std::to_string(length));
  }
  length_ = length;
}

gpu::RopeTables& KvCache::rope(const at::Device& device) {
  for (auto& [on, tables] : rope_) {
    if (on == device) return tables;
  }
  return rope_.emplace_back(device, gpu::RopeTables{}).second;
}

namespace {

// Scores of queries at positions [past, past + S) against keys [0, L): row r of the S query
// rows (repeated `groups` times, r = g * S + i) may see key j when j <= past + i.
at::Tensor maskFuture(const at::Tensor& scores, int64_t rows_per_group, int64_t past) {
  if (rows_per_group == 1) return scores;  // one new token sees everything before it
  const auto options = at::TensorOptions().dtype(at::kLong).device(scores.device());
  const int64_t rows = scores.size(-2), keys = scores.size(-1);
  const at::Tensor query_pos = at::arange(rows, options).remainder(rows_per_group) + past;
  const at::Tensor future = at::arange(keys, options).unsqueeze(0) > query_pos.unsqueeze(1);
  return scores.masked_fill(future, -std::numeric_limits<double>::infinity());
}

// Attention against the cache is computed in fp32, with the cache's rows converted on the fly.
// Its key length grows by one every decode step, and a bf16 matmul on the CPU goes to oneDNN,
// which builds (JIT-compiles) a new kernel for every new shape: that cost more than the product
// itself. fp32 matmuls go to MKL, which has no per-shape setup; the conversion reads the same
// bytes once. fp32 scores are also what transformers' eager attention softmaxes.

// q [B, heads, S, dk] at positions [past, past + S); keys [B, kv_heads, L, dk] and values
// [B, kv_heads, L, dv] hold every position up to past + S. Query heads are grouped under their
// key/value head (repeat_kv's order), so the cache is read in place, never repeated.
// -> [B, S, heads * dv] in q's dtype
at::Tensor attendToCache(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                         double scaling, int64_t past) {
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2);
  const int64_t kv_heads = keys.size(1), groups = heads / kv_heads;
  const at::Tensor grouped =
      (q.to(at::kFloat) * scaling).reshape({batch, kv_heads, groups * seq, q.size(3)});
  const at::Tensor scores = at::matmul(grouped, keys.to(at::kFloat).transpose(-1, -2));
  const at::Tensor probs = at::softmax(maskFuture(scores, seq, past), -1);
  const at::Tensor out = at::matmul(probs, values.to(at::kFloat));  // [B, kv_heads, groups * S, dv]
  return out.view({batch, heads, seq, values.size(3)})
      .transpose(1, 2)
      .reshape({batch, seq, -1})
      .to(q.scalar_type());
}

}  // namespace

at::Tensor gqaForwardCached(const gpu::GqaAttention& a, const at::Tensor& x,
                            const gpu::RopeTables& rope, LayerKvCache& cache, int64_t past,
                            int64_t capacity) {
  const int64_t batch = x.size(0), seq = x.size(1);
  auto heads = [&](const gpu::LoraLinear& proj, int n, const at::Tensor& norm) {
    at::Tensor t = proj.forward(x, false).view({batch, seq, n, a.head_dim});
    if (norm.defined()) t = gpu::rmsNorm(t, norm, a.rms_norm_eps);
    return t.transpose(1, 2);  // [B, n, S, head_dim]
  };
  const at::Tensor q =
      gpu::Rope::apply(heads(a.q_proj, a.num_heads, a.q_norm), rope, gpu::RopeLayout::Halves);
  const at::Tensor k =
      gpu::Rope::apply(heads(a.k_proj, a.num_kv_heads, a.k_norm), rope, gpu::RopeLayout::Halves);
  const at::Tensor v = heads(a.v_proj, a.num_kv_heads, at::Tensor());
  if (!cache.key.defined()) {
    cache.key = at::empty({batch, a.num_kv_heads, capacity, a.head_dim}, k.options());
    cache.value = at::empty({batch, a.num_kv_heads, capacity, a.head_dim}, v.options());
  }
  cache.key.narrow(2, past, seq).copy_(k);
  cache.value.narrow(2, past, seq).copy_(v);
  // A fresh prompt takes the training path (exactly the model's full forward).
  const at::Tensor context =
      past == 0 ? gpu::causalAttention(q, k, v, a.scaling)
                : attendToCache(q, cache.key.narrow(2, 0, past + seq),
                                cache.value.narrow(2, 0, past + seq), a.scaling, past);
  return a.o_proj.forward(context, false);
}

at::Tensor mlaForwardCached(const gpu::MlaAttention& a, const at::Tensor& x,
                            const gpu::RopeTables& rope, LayerKvCache& cache, int64_t past,
                            int64_t capacity) {
  const int64_t batch = x.size(0), seq = x.size(1), total = past + seq;
  const int64_t qk_head_dim = a.qk_nope_head_dim + a.qk_rope_head_dim;
  at::Tensor q =
      a.q_proj.defined()
          ? a.q_proj.forward(x, false)
          : a.q_b_proj.forward(
                gpu::rmsNorm(a.q_a_proj.forward(x, false), a.q_a_layernorm, a.rms_norm_eps), false);
  q = q.view({batch, seq, a.num_heads, qk_head_dim}).transpose(1, 2);  // [B, heads, S, qk]
  const at::Tensor q_nope = q.narrow(-1, 0, a.qk_nope_head_dim);
  const at::Tensor q_rot =
      gpu::Rope::apply(q.narrow(-1, a.qk_nope_head_dim, a.qk_rope_head_dim), rope, a.rope_layout);

  const at::Tensor compressed = a.kv_a_proj_with_mqa.forward(x, false);
  const at::Tensor latent =
      gpu::rmsNorm(compressed.narrow(-1, 0, a.kv_lora_rank), a.kv_a_layernorm, a.rms_norm_eps);
  const at::Tensor k_rot =
      gpu::Rope::apply(compressed.narrow(-1, a.kv_lora_rank, a.qk_rope_head_dim)
                           .view({batch, 1, seq, a.qk_rope_head_dim}),
                       rope, a.rope_layout);
  if (!cache.latent.defined()) {
    cache.latent = at::empty({batch, capacity, a.kv_lora_rank}, latent.options());
    cache.rope_key = at::empty({batch, capacity, a.qk_rope_head_dim}, k_rot.options());
  }
  cache.latent.narrow(1, past, seq).copy_(latent);
  cache.rope_key.narrow(1, past, seq).copy_(k_rot.view({batch, seq, a.qk_rope_head_dim}));

  at::Tensor context;
  if (past == 0) {
    // Prefill: expand K/V once for the prompt, as the full forward does.
    const at::Tensor kv = a.kv_b_proj.forward(latent, false)
                              .view({batch, seq, a.num_heads, a.qk_nope_head_dim + a.v_head_dim})
                              .transpose(1, 2);
    const at::Tensor key = at::cat({kv.narrow(-1, 0, a.qk_nope_head_dim),
                                    k_rot.expand({batch, a.num_heads, seq, a.qk_rope_head_dim})},
                                   -1);
    const at::Tensor value = kv.narrow(-1, a.qk_nope_head_dim, a.v_head_dim);
    context = gpu::causalAttention(at::cat({q_nope, q_rot}, -1), key, value, a.scaling);
  } else {
    // Decode: attend in the latent space. q_nope·k_nope = (q_nope W_UK)·latent and
    // Σ p·v = (Σ p·latent) W_UVᵀ, so the cache is never expanded per head.
    if (!cache.w_uk.defined()) {
      const at::Tensor w = a.kv_b_proj.mergedWeight().view(
          {a.num_heads, a.qk_nope_head_dim + a.v_head_dim, a.kv_lora_rank});
      cache.w_uk = w.narrow(1, 0, a.qk_nope_head_dim).contiguous();
      cache.w_uv = w.narrow(1, a.qk_nope_head_dim, a.v_head_dim).transpose(1, 2).contiguous();
    }
    // In fp32, as attendToCache and for the same reason.
    const at::Tensor lat =
        cache.latent.narrow(1, 0, total).unsqueeze(1).to(at::kFloat);  // [B, 1, L, rank]
    const at::Tensor rk =
        cache.rope_key.narrow(1, 0, total).unsqueeze(1).to(at::kFloat);  // [B, 1, L, rope]
    const at::Tensor q_latent =
        at::matmul(q_nope, cache.w_uk).to(at::kFloat) * a.scaling;  // [B, heads, S, rank]
    const at::Tensor scores = at::matmul(q_latent, lat.transpose(-1, -2)) +
                              at::matmul(q_rot.to(at::kFloat) * a.scaling, rk.transpose(-1, -2));
    const at::Tensor probs = at::softmax(maskFuture(scores, seq, past), -1);
    const at::Tensor ctx_latent =
        at::matmul(probs, lat).to(x.scalar_type());  // [B, heads, S, rank]
    context = at::matmul(ctx_latent, cache.w_uv).transpose(1, 2).reshape({batch, seq, -1});
  }
  return a.o_proj.forward(context, false);
}

at::Tensor CausalLm::forwardCached(const at::Tensor& input_ids, KvCache& cache) const {
  const gpu::FusedRmsNormScope
      fused_norms;  // inference: no recomputation has to match these values
  if (input_ids.dim() != 2 || input_ids.size(0) != cache.batch() || input_ids.size(1) == 0) {
    throw Error("cached forward: input ids must be [batch, seq] with the cache's batch");
  }
  const int64_t past = cache.length(), seq = input_ids.size(1);
  if (past + seq > cache.capacity()) {
    throw Error("the sequence (" + std::to_string(past + seq) +
                " tokens) outgrew its KV cache of " + std::to_string(cache.capacity()));
  }
  // Checked on the host, where ids come from (a prompt, the sampler): a tensor min/max and two
  // item() calls per decode step cost more than this loop over a handful of ids.
  const at::Tensor host_ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t* id = host_ids.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < host_ids.numel(); ++i) {
    if (id[i] < 0 || id[i] >= config_.vocab_size) {
      throw Error("token id " + std::to_string(id[i]) + " is outside the vocabulary [0, " +
                      std::to_string(config_.vocab_size) + ")",
                  "the tokens do not belong to this model's tokenizer");
    }
  }
  // The tables of these S positions on `device`.
  auto ropeOn = [&](const at::Device& device) {
    gpu::RopeTables& all = cache.rope(device);
    if (!all.cos.defined()) all = rope_.tables(cache.capacity(), device);
    return gpu::RopeTables{all.cos.narrow(0, past, seq), all.sin.narrow(0, past, seq)};
  };
  const double eps = config_.rms_norm_eps;
  at::Tensor x = at::embedding(embed_tokens, host_ids.to(embed_device_));
  for (size_t i = 0; i < layers_.size(); ++i) {
    const DecoderLayer& layer = layers_[i];
    // As in forwardHidden: only the activations cross to the layer's device, where its weights
    // and its part of the cache live.
    x = x.to(layer_devices_[i]);
    const gpu::RopeTables rope = ropeOn(layer_devices_[i]);
    const at::Tensor normed = gpu::rmsNorm(x, layer.input_layernorm, eps);
    LayerKvCache& c = cache.layer(i);
    const at::Tensor attn =
        layer.gqa ? gqaForwardCached(*layer.gqa, normed, rope, c, past, cache.capacity())
                  : mlaForwardCached(*layer.mla, normed, rope, c, past, cache.capacity());
    const at::Tensor h = x + attn;
    const at::Tensor normed2 = gpu::rmsNorm(h, layer.post_attention_layernorm, eps);
    x = h +
        (layer.moe ? layer.moe->forward(normed2, false) : layer.dense_mlp.forward(normed2, false));
  }
  cache.advance(seq);
  return gpu::rmsNorm(x.to(head_device_), final_norm, eps);
}

}  // namespace tandem::model
