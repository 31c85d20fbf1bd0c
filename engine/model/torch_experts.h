#pragma once
// Routed experts computed with torch ops on a torch device: the one implementation behind the
// offload mode (every expert, weights streamed per call: expert_offload.h) and the GPU-resident
// experts (a few hot experts whose weights stay on the layer's device: resident_experts.h).
//
// Math as ExpertLayer: g = gate(x), u = up(x), o = down(silu(g) ⊙ u), y_t = Σ_j w_tj · o_tj over
// the pairs computed here, with P(x) = x W_Pᵀ + s · (x A_Pᵀ) B_Pᵀ. Projections run in the model
// dtype with the LoRA branch in fp32 and cast back (PEFT); the weighted sum is fp32.
//
// The expert LoRA stays in the ExpertLayer's fp32 host buffers (ExpertLora): each call copies A
// and B of the experts it computes to the device, the backward copies their gradients back and
// accumulates them there. Backward recomputes the forward (reentrant autograd): nothing of the
// forward's intermediates is kept on the device, except in a checkpoint recompute, whose backward
// follows at once: that forward keeps its graph for it, so the experts are computed twice a step
// (forward, recompute) and not three times, and offload mode streams their weights twice.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/experts/expert_lora.h"
#include "engine/experts/expert_types.h"

namespace tandem::model {

// Frozen weights of n experts in the model dtype: gate, up [n, I, H], down [n, H, I]. Int8
// experts (stored_expert_weights.h) come as their int8 values in the model dtype (exact) with
// each weight row's fp32 scale, [n, I], [n, I], [n, H], applied to the products' outputs:
// x (q · s)ᵀ = (x qᵀ) ⊙ s, so the weights are never rounded to the model dtype.
struct TorchExpertWeights {
  at::Tensor gate, up, down;
  at::Tensor gate_scale, up_scale, down_scale;  // undefined: unscaled
  uint64_t bytes() const;                       // all of them, as held
};

// Copies of the listed experts' weights (views as the CPU engine reads them, or FP8_E4M3 views
// dequantised with their block scales) made with `options` (dtype, device, pinned host memory),
// one expert at a time: no host copy of them all on the way to a device.
TorchExpertWeights stackExpertWeights(const experts::ExpertLayerSpec& spec,
                                      const experts::ExpertWeightViews& views,
                                      const std::vector<int64_t>& experts,
                                      const at::TensorOptions& options);

// How the experts' matrix products run. PerExpert (the reference): one at::linear per expert
// and projection, hundreds of small kernels a layer. Grouped: one at::_grouped_mm per
// projection over all experts' rows.
enum class ExpertGemm { PerExpert, Grouped };

// Grouped where torch has a grouped kernel for the device and dtype (CUDA compute capability
// 9.x/10.x in bf16; the CPU, where torch loops over the groups) and every matrix row is a
// multiple of 16 bytes (its alignment rule), else PerExpert. `dtype` is the model dtype for the
// frozen projections or fp32 for the LoRA branch; `row_lengths` are the matrices' inner sizes
// (H, I, and the rank for the LoRA branch).
ExpertGemm expertGemmFor(at::Device device, at::ScalarType dtype,
                         const std::vector<int64_t>& row_lengths);

// The (token, slot) pairs of one call grouped by the expert that computes them here, built on
// the host (no device sync; copied to the device asynchronously from pinned memory).
struct ExpertGrouping {
  at::Tensor order;             // [P] int64 on the device: flat slots t·k + j, by expert (stable)
  at::Tensor pair_token;        // [P] int64 on the device: order / k
  at::Tensor offsets;           // [n] int32 on the device: cumulative pair counts (grouped GEMM)
  at::Tensor pair_expert;       // [P] int64 on the device: the local expert of each grouped pair
  std::vector<int64_t> counts;  // [n] pairs per local expert, on the host
  int64_t pairs() const;
};

// local_ids [T, k] int64 on the host: the local expert (0..n-1) of every slot, or -1 for a slot
// computed elsewhere.
ExpertGrouping groupByExpert(const at::Tensor& local_ids, int64_t n_experts, at::Device device);

// The same per run of `chunk_tokens` consecutive tokens (the last run shorter; chunk_tokens <= 0
// or >= T: one run), each run's slots and tokens counted from its first token: what a
// TorchExpertsCall in token chunks computes one run at a time.
std::vector<ExpertGrouping> groupByExpertPerChunk(const at::Tensor& local_ids, int64_t n_experts,
                                                  at::Device device, int64_t chunk_tokens);

// The experts' part of one call. Local expert i is global expert `global_ids[i]` of `lora` ([n]
// int64 host; undefined: local i is global i, every expert). `weights` returns the n experts'
// weights on the device (called in forward and again in backward). hidden [T, H] model dtype and
// topk_weights [T, k] fp32, on the device.
class TorchExpertsCall {
 public:
  // `gemm` forces a kernel (tests compare the two); by default expertGemmFor decides.
  TorchExpertsCall(std::function<TorchExpertWeights()> weights, experts::ExpertLora& lora,
                   at::Tensor global_ids, ExpertGrouping grouping,
                   std::optional<ExpertGemm> gemm = std::nullopt);
  // In token chunks (issue 29): `chunks` from groupByExpertPerChunk(.., chunk_tokens). Forward
  // and backward take the weights once each and compute one chunk's pairs at a time, so the
  // [pairs, intermediate] products and the LoRA branch's rows are one chunk's; the backward
  // recomputes each chunk's graph (a checkpoint recompute keeps the weights for it, not a graph
  // of every chunk): the experts are computed once more a step than in one chunk, their
  // weights fetched as often.
  TorchExpertsCall(std::function<TorchExpertWeights()> weights, experts::ExpertLora& lora,
                   at::Tensor global_ids, std::vector<ExpertGrouping> chunks, int64_t chunk_tokens,
                   std::optional<ExpertGemm> gemm = std::nullopt);

  int64_t pairs() const;
  size_t chunks() const { return chunks_.size(); }

  // `start` begins copying the weights `weights` will return (experts_mode auto's streamed
  // experts: split_experts.h); prefetch() calls it unless the forward kept its graph, so the
  // copy runs while the device computes the work queued after it.
  void setPrefetch(std::function<void()> start) { prefetch_ = std::move(start); }
  void prefetch() const;

  // -> [T, H] in hidden's dtype: the sum over the grouped pairs, not differentiable. With
  // keep_graph (a checkpoint recompute: its backward follows at once) the forward's graph is
  // built now and kept in this call until backward(), which then does not recompute it.
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& topk_weights,
                     bool keep_graph = false) const;

  struct Gradients {
    at::Tensor d_hidden;           // [T, H] hidden's dtype
    at::Tensor d_topk_weights;     // [T, k] fp32 (0 for the slots computed elsewhere)
    std::vector<at::Tensor> lora;  // d A, d B of every targeted projection, on the device
  };
  // Queues the backward of forward() for dy [T, H] on the device, recomputing that forward
  // unless it kept its graph; returns without waiting for the device (so the CPU can work
  // meanwhile).
  Gradients backward(const at::Tensor& hidden, const at::Tensor& topk_weights,
                     const at::Tensor& dy) const;
  // Adds grads.lora to the host LoRA gradient buffers (waits for the device).
  void accumulateLora(const Gradients& grads) const;

 private:
  std::function<TorchExpertWeights()> weights_;
  experts::ExpertLora& lora_;
  at::Tensor global_ids_;
  std::vector<ExpertGrouping> chunks_;  // one: the whole call
  int64_t chunk_tokens_ = 0;            // tokens per chunk (the last shorter); 0: one chunk
  std::optional<ExpertGemm> gemm_;
  std::function<void()> prefetch_;

  // The differentiable forward: y and the leaves it is differentiated in (hidden, the top-k
  // weights, then A and B of every targeted projection).
  struct Graph {
    at::Tensor y;
    std::vector<at::Tensor> inputs;
  };
  Graph differentiableForward(const at::Tensor& hidden, const at::Tensor& topk_weights) const;
  mutable std::shared_ptr<Graph> graph_;  // forward's, with keep_graph; taken by backward()
  // In chunks, with keep_graph: the weights the forward took, taken by backward().
  mutable std::shared_ptr<TorchExpertWeights> kept_weights_;
  at::Tensor forwardInChunks(const at::Tensor& hidden, const at::Tensor& topk_weights,
                             bool keep_weights) const;
  Gradients backwardInChunks(const at::Tensor& hidden, const at::Tensor& topk_weights,
                             const at::Tensor& dy) const;
};

// TorchExpertsCall::forward as its own autograd node: differentiable in hidden and topk_weights;
// lora_anchor as routedExperts (moe_function.h); the LoRA grads accumulate into the call's lora.
at::Tensor torchExperts(TorchExpertsCall call, const at::Tensor& hidden,
                        const at::Tensor& topk_weights, const at::Tensor& lora_anchor);

}  // namespace tandem::model
