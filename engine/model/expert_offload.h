#pragma once
// Offload mode (ExpertsMode::GpuOffload), the baseline co-computation is measured against: the
// ZeRO-Offload paradigm applied to the routed experts. Their frozen weights stay in host memory
// (pinned when the layer is on a GPU) and are copied to the layer's device for every use, once in
// forward and once more in backward, then computed there with torch ops; the device holds two
// layers' copies at most (expert_streamer.h). experts_format int8 keeps and streams them as the CPU
// engine's int8 (stored_expert_weights.h): half the bytes over PCIe, dequantised on the device.
//
// The expert LoRA stays in the ExpertLayer's fp32 host buffers (ExpertLora) in both modes: A and B
// travel to the device with the weights, their gradients come back and accumulate there. So the
// optimizer (as in ZeRO-Offload, the expert part steps on the CPU), the global grad-norm clip,
// checkpoints and adapter export are the same code for both modes.
//
// A resident cache (ModelOptions::gpu_experts in this mode): the `resident_count` most routed
// experts of the layer's first call are copied to the device for good (resident_experts.h) and
// only the others are streamed. Same math: the two groups of pairs are summed. The host copy
// keeps every expert, reordered at that first call so the streamed ones come first: each call
// copies them out of it in one run per tensor.
//
// The copies run on a side stream (side_copy.h) through the device's ExpertStreamer
// (expert_streamer.h), which starts the next layer's while the device computes this one's, and
// a layer's own before its resident experts, which the copy then overlaps.
//
// The compute (torch ops, the LoRA's round trip, the backward) is torch_experts.h's.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/experts/expert_lora.h"
#include "engine/experts/expert_types.h"
#include "engine/gpu/side_copy.h"
#include "engine/model/expert_streamer.h"
#include "engine/model/resident_experts.h"
#include "engine/model/stored_expert_weights.h"
#include "engine/model/torch_experts.h"

namespace tandem::model {

class ExpertOffload {
 public:
  // Copies the experts' weights (views in `dtype`, as the CPU engine reads them, or FP8_E4M3
  // views with their block scales, dequantised to `dtype`) into host memory in `format`: gate, up
  // [E, I, H] and down [E, H, I]; pinned when the streamer's device is a GPU. Registers the layer
  // with `streamer` (the layers of a device in forward order), which must outlive its calls.
  ExpertOffload(const experts::ExpertLayerSpec& spec, const experts::ExpertWeightViews& weights,
                at::ScalarType dtype, experts::WeightFormat format,
                std::shared_ptr<ExpertStreamer> streamer, int64_t resident_count = 0);

  // hidden [T, H] model dtype on the layer's device; topk_ids [T, k] int64; topk_weights [T, k]
  // fp32; lora_anchor as routedExperts (moe_function.h). -> [T, H] model dtype on that device.
  // Backward returns d hidden and d topk_weights and accumulates the LoRA grads into `lora`.
  // resident_pairs (optional) gets the pairs the resident cache computed.
  at::Tensor forward(experts::ExpertLora& lora, const at::Tensor& hidden,
                     const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                     const at::Tensor& lora_anchor, int64_t* resident_pairs = nullptr) const;

  // Tokens per chunk of the experts' compute (ModelOptions::moe_token_chunk, resolved): each
  // call computes its pairs that many tokens at a time, the weights taken once per pass
  // (TorchExpertsCall in chunks). 0: every pair at once.
  void setTokenChunk(int64_t tokens) { token_chunk_ = tokens; }
  int64_t tokenChunk() const { return token_chunk_; }

  at::Device device() const { return device_; }
  uint64_t hostBytes() const { return charge_.bytes(); }
  // The resident cache's experts (empty before the first call, or without one).
  std::vector<int64_t> residentExperts() const;
  // Experts streamed per call: all of them, or those the resident cache leaves.
  int64_t streamedExperts() const;

  const ExpertStreamer& streamer() const { return *streamer_; }

 private:
  // The first call: copies the `resident_count_` most routed experts of ids [T, k] (host int64)
  // to the device.
  void makeResident(const at::Tensor& ids) const;
  // The streamed experts' weights copied by `copy`, usable once it joined; nullopt before the
  // first call chose the resident cache.
  std::optional<StoredExpertWeights> streamed(gpu::SideCopy& copy) const;

  int64_t num_experts_;
  int64_t resident_count_;
  // Every expert; with a resident cache reordered at the first call, the streamed ones first.
  mutable StoredExpertWeights host_;
  mutable std::vector<int64_t> streamed_;  // every expert, or those the cache leaves, ascending
  mutable at::Tensor streamed_ids_;        // [n] int64 host: the same, for their LoRA
  mutable std::vector<int64_t> streamed_local_;  // [E]: local index of a streamed expert, else -1
  mutable std::unique_ptr<ResidentExperts> resident_;
  at::Device device_;
  std::shared_ptr<ExpertStreamer> streamer_;
  int stream_index_ = -1;  // this layer's in streamer_
  int64_t token_chunk_ = 0;
  MemoryCharge charge_;
};

}  // namespace tandem::model
