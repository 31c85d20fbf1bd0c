#pragma once
// One MoE feed-forward block: the router and shared experts on the layer's torch device, the
// routed experts on the CPU expert engine (or, in offload mode, streamed to that device), a few
// of them optionally resident on the device (resident_experts.h). The shared experts and the
// resident experts are queued on the device before the CPU computes the other routed pairs, so
// on a GPU they run at once.
//   qwen3_moe / mixtral:  y = routed(x)
//   qwen2_moe:            y = routed(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)
//   deepseek_v2 / v3:     y = routed(x) + shared_experts(x)
// and, with LoRA experts (lora_experts.h), y + LE(x) on top of any of them.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "engine/experts/expert_layer.h"
#include "engine/gpu/lora_linear.h"
#include "engine/gpu/mlp.h"
#include "engine/gpu/router.h"
#include "engine/model/expert_offload.h"
#include "engine/model/lora_experts.h"
#include "engine/model/moe_function.h"
#include "engine/model/resident_experts.h"
#include "engine/model/split_experts.h"

namespace tandem::model {

struct MoeBlock {
  gpu::Router router;
  std::unique_ptr<experts::ExpertLayer> experts;  // computes in cpu mode; holds the expert LoRA
  std::unique_ptr<ExpertOffload> offload;         // offload mode only (with its own resident cache)
  std::vector<at::Tensor> expert_weight_owners;   // CPU tensors the expert views point into
  // ModelOptions::gpu_experts: experts made resident on the layer's device at the first call
  // (offload mode: by `offload`, which streams the others; else here, beside the CPU engine),
  // from its routing, copied from resident_source (views as the CPU engine's) and kept in
  // resident_format (the CPU engine's: experts_format).
  int64_t resident_count = 0;
  mutable experts::ExpertWeightViews resident_source;  // emptied once released (below)
  // Frees what resident_source points into (a random model's invented experts, converted copies)
  // once the first call made the resident experts and the CPU engine packed the others into memory
  // of its own (causal_lm_builder.cpp sets it unless keep_random_experts). Empty: nothing to free.
  mutable std::function<void()> release_resident_source;
  experts::WeightFormat resident_format = experts::WeightFormat::Bf16;
  mutable std::unique_ptr<ResidentExperts> resident;
  gpu::GatedMlp shared;              // undefined when the model has none
  gpu::LoraLinear shared_gate;       // qwen2_moe: [1, hidden]
  LoraExperts lora_experts;          // issue 32: added to the output; undefined when off
  at::Tensor lora_anchor;            // see routedExperts()
  bool keep_expert_forward = false;  // ModelOptions::keep_expert_forward
  // One per token chunk, filled by the checkpointed pass.
  mutable std::vector<KeptExpertForward> kept;
  // ModelOptions::moe_token_chunk (resolved): forward() takes the tokens this many at a time, each
  // chunk routed and computed on its own (its own autograd nodes), so the router's logits, the
  // CPU engine's gathered buffers and the resident experts' [pairs, intermediate] products are
  // those of one chunk. 0: one chunk. Offload mode runs the block as one chunk (its streamer
  // takes a layer's experts once per pass) and computes the experts' pairs in chunks of this
  // many tokens inside the call (ExpertOffload::setTokenChunk); the shared experts then chunk
  // themselves (GatedMlp::token_chunk).
  int64_t token_chunk = 0;
  // experts_mode auto only: the per-call split (with its own resident cache, split_experts.h).
  std::unique_ptr<SplitExperts> split;
  // Sees every forward's routing, ids [tokens, top_k] on the block's device (the e2e bench's
  // routing statistics); empty: nobody asks.
  std::function<void(const at::Tensor& ids)> route_observer;
  // (token, slot) pairs of every call so far, and how many the resident experts computed: the
  // share of the routed work they take from the CPU engine (the run tells the user after step 1).
  struct PairCounts {
    int64_t routed = 0, resident = 0;
  };
  mutable PairCounts pairs;

  // x [B, S, hidden] -> [B, S, hidden]
  at::Tensor forward(const at::Tensor& x, bool training) const;

 private:
  // tokens [T, hidden] (one chunk) -> [T, hidden]; `kept` its KeptExpertForward.
  at::Tensor forwardTokens(const at::Tensor& tokens, bool training,
                           KeptExpertForward& kept_chunk) const;
  // experts_mode auto's routed part: tokens [T, hidden], the router's ids and weights [T, k].
  at::Tensor splitForward(const at::Tensor& tokens, const at::Tensor& ids,
                          const at::Tensor& weights, const std::function<void()>& run_shared,
                          bool training, KeptExpertForward& kept_chunk) const;
};

}  // namespace tandem::model
