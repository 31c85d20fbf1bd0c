#pragma once
// The KV cache of CausalLm::forwardCached: what each layer's attention keeps of the tokens seen
// so far, preallocated for `capacity` positions so a decode step writes one slot and allocates
// nothing that grows with the sequence.
//   GQA: keys (after rope) and values, [B, kv_heads, capacity, head_dim].
//   MLA: the compressed latent (kv_a_proj output after kv_a_layernorm) [B, capacity,
//        kv_lora_rank] and the rotated shared rope key [B, capacity, rope_dim]; never the
//        expanded per-head K/V (DeepSeek's point: 576 numbers per token instead of 40 960).
// A cache belongs to one model and one adapter: the LoRA weights are folded into the absorbed
// MLA matrices the first time a layer runs, so switching adapters needs a fresh cache.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/gpu/attention.h"
#include "engine/gpu/rope.h"

namespace tandem::model {

struct LayerKvCache {
  at::Tensor key, value;        // GQA, allocated by the layer's first call
  at::Tensor latent, rope_key;  // MLA
  // MLA decode multiplies queries into the latent space ("weight absorption"): kv_b_proj's
  // weight (LoRA merged) split per head, W_UK [heads, nope, rank] and W_UV [heads, v, rank].
  at::Tensor w_uk, w_uv;
};

class KvCache {
 public:
  KvCache(int64_t num_layers, int64_t batch, int64_t capacity);

  int64_t length() const { return length_; }  // positions filled
  int64_t capacity() const { return capacity_; }
  int64_t batch() const { return batch_; }
  // Forgets positions >= `length` (keeps a shared prompt prefix for the next request).
  void truncate(int64_t length);

  // For CausalLm::forwardCached.
  LayerKvCache& layer(size_t index) { return layers_[index]; }
  // Positions [0, capacity) on `device`, empty until CausalLm fills them: a model split over
  // devices keeps one copy where each of its layers runs.
  gpu::RopeTables& rope(const at::Device& device);
  void advance(int64_t tokens) { length_ += tokens; }

 private:
  std::vector<LayerKvCache> layers_;
  std::vector<std::pair<at::Device, gpu::RopeTables>> rope_;
  int64_t batch_ = 1;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
};

// x [B, S, hidden] at positions [past, past + S) -> [B, S, hidden]; writes the layer's cache.
// `rope`: the tables of those S positions.
at::Tensor gqaForwardCached(const gpu::GqaAttention& attention, const at::Tensor& x,
                            const gpu::RopeTables& rope, LayerKvCache& cache, int64_t past,
                            int64_t capacity);
at::Tensor mlaForwardCached(const gpu::MlaAttention& attention, const at::Tensor& x,
                            const gpu::RopeTables& rope, LayerKvCache& cache, int64_t past,
                            int64_t capacity);

}  // namespace tandem::model
