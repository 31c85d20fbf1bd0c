#pragma once
// Offload mode (ExpertsMode::GpuOffload), the baseline co-computation is measured against: the
// ZeRO-Offload paradigm applied to the routed experts. Their frozen weights stay in host memory
// (pinned when the layer is on a GPU) and are copied to the layer's device for every use, once in
// forward and once more in backward, then computed there with torch ops; nothing of them stays on
// the device after the layer ran. experts_format int8 keeps and streams them as the CPU engine's
// int8 (stored_expert_weights.h): half the bytes over PCIe, dequantised on the device.
//
// The expert LoRA stays in the ExpertLayer's fp32 host buffers (ExpertLora) in both modes: A and B
// travel to the device with the weights, their gradients come back and accumulate there. So the
// optimizer (as in ZeRO-Offload, the expert part steps on the CPU), the global grad-norm clip,
// checkpoints and adapter export are the same code for both modes.
//
// A resident cache (ModelOptions::gpu_experts in this mode): the `resident_count` most routed
// experts of the layer's first call are copied to the device for good (resident_experts.h) and
// only the others are streamed; their copy runs on a side stream (side_copy.h) while the device
// computes the resident experts' pairs. Same math: the two groups of pairs are summed. The host
// copy keeps every expert (the streamed ones are copied out of it run by run).
//
// The compute (torch ops, the LoRA's round trip, the backward) is torch_experts.h's.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/experts/expert_lora.h"
#include "engine/experts/expert_types.h"
#include "engine/gpu/resident_experts.h"
#include "engine/gpu/side_copy.h"
#include "engine/gpu/stored_expert_weights.h"
#include "engine/gpu/torch_experts.h"

namespace tandem::gpu {

class ExpertOffload {
 public:
  // Copies the experts' weights (views in `dtype`, as the CPU engine reads them, or FP8_E4M3
  // views with their block scales, dequantised to `dtype`) into host memory in `format`: gate, up
  // [E, I, H] and down [E, H, I]; pinned when `device` is a GPU.
  ExpertOffload(const experts::ExpertLayerSpec& spec, const experts::ExpertWeightViews& weights,
                at::ScalarType dtype, experts::WeightFormat format, at::Device device,
                int64_t resident_count = 0);

  // hidden [T, H] model dtype on the layer's device; topk_ids [T, k] int64; topk_weights [T, k]
  // fp32; lora_anchor as routedExperts (moe_function.h). -> [T, H] model dtype on that device.
  // Backward returns d hidden and d topk_weights and accumulates the LoRA grads into `lora`.
  // resident_pairs (optional) gets the pairs the resident cache computed.
  at::Tensor forward(experts::ExpertLora& lora, const at::Tensor& hidden,
                     const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                     const at::Tensor& lora_anchor, int64_t* resident_pairs = nullptr) const;

  at::Device device() const { return device_; }
  uint64_t hostBytes() const { return charge_.bytes(); }
  // The resident cache's experts (empty before the first call, or without one).
  std::vector<int64_t> residentExperts() const;
  // Experts streamed per call: all of them, or those the resident cache leaves.
  int64_t streamedExperts() const;

  // Every expert's weights on the device in the model dtype, copied from host memory
  // (asynchronously from pinned memory).
  TorchExpertWeights stream() const;

 private:
  // The first call: copies the `resident_count_` most routed experts of ids [T, k] (host int64)
  // to the device.
  void makeResident(const at::Tensor& ids) const;
  // The streamed experts' weights copied by `copy`, usable once it joined.
  StoredExpertWeights streamRest(SideCopy& copy) const;

  int64_t num_experts_;
  int64_t resident_count_;
  StoredExpertWeights host_;                      // every expert
  mutable std::vector<int64_t> streamed_;         // with a resident cache: the others, ascending
  mutable at::Tensor streamed_ids_;               // [n] int64 host: the same, for their LoRA
  mutable std::vector<int64_t> streamed_local_;   // [E]: local index of a streamed expert, else -1
  mutable std::unique_ptr<ResidentExperts> resident_;
  at::Device device_;
  MemoryCharge charge_;
};

}  // namespace tandem::gpu
