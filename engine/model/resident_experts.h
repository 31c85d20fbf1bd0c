#pragma once
// GPU-resident routed experts (co-computation mode, ModelOptions::gpu_experts): per MoE layer a
// few experts whose frozen weights live permanently on the layer's device, in the model dtype or
// (experts_format int8) as the CPU engine's int8 (stored_expert_weights.h), computed there with
// torch ops (torch_experts.h) while the CPU expert engine computes the other (token, expert) pairs
// of the same call; the outputs are summed. The CPU engine sees the resident experts' slots as
// masked (experts::kMaskedSlot), so no pair is computed twice.
//
// Which experts: the `count` most routed of the layer's first call (ties: the lower id), then
// fixed for the model's life, so the gradient-checkpointing recomputation and every later step
// split the same way. Their LoRA stays in the ExpertLayer's ExpertLora (fp32 host): each call
// copies the resident experts' A/B slices to the device and their gradients come back, as in
// offload mode. The CPU engine never packs them (ExpertLayerOptions::defer_packs, then
// ExpertLayer::releaseExperts packs the others).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/experts/expert_lora.h"
#include "engine/experts/expert_types.h"
#include "engine/model/stored_expert_weights.h"
#include "engine/model/torch_experts.h"

namespace tandem::model {

class ResidentExperts {
 public:
  // Copies the listed experts' weights (views as the CPU engine reads them; fp8 dequantised) to
  // `device`, computed in `dtype` and kept in `format`, charged to the ledger as that device's
  // weights.
  ResidentExperts(const experts::ExpertLayerSpec& spec, const experts::ExpertWeightViews& views,
                  std::vector<int64_t> experts, at::ScalarType dtype, experts::WeightFormat format,
                  at::Device device);
  // The listed experts of a layer of `num_experts`, whose weights `on_device` already holds on
  // `device` (offload mode's resident cache: a selection of its host copy).
  ResidentExperts(int64_t num_experts, std::vector<int64_t> experts, StoredExpertWeights on_device,
                  at::Device device);

  // The `count` experts with the most slots in ids [T, k] (host, int64), ties to the lower id,
  // returned in increasing id order.
  static std::vector<int64_t> mostRouted(const at::Tensor& ids, int64_t num_experts, int64_t count);

  struct Split {
    at::Tensor cpu_ids;       // [T, k] int32 host: the slots of resident experts kMaskedSlot
                              // (the CPU engine's input; undefined when not asked for)
    int64_t other_pairs = 0;  // slots the resident experts leave: the CPU engine's, or offload
                              // mode's streamed experts'
    ExpertGrouping grouping;  // the resident experts' pairs, on the device
    // With chunk_tokens: the same per run of that many tokens (groupByExpertPerChunk), and
    // `grouping` empty; call() then computes them a chunk at a time.
    std::vector<ExpertGrouping> chunks;
    int64_t chunk_tokens = 0;
  };
  // ids [T, k] host int64 (the router's choice). chunk_tokens > 0: grouped per token chunk
  // (offload mode's resident cache over a long sequence).
  Split split(const at::Tensor& ids, bool with_cpu_ids = true, int64_t chunk_tokens = 0) const;

  // The resident experts' part of one call (their pairs in `split`), computed on the device;
  // the ResidentExperts must outlive it.
  TorchExpertsCall call(experts::ExpertLora& lora, Split& split) const;

  const std::vector<int64_t>& experts() const { return experts_; }
  // The weights on the device and the experts' global ids ([n] int64 host), for a call that
  // must keep them alive itself (experts_mode auto re-places the cache: split_experts.h).
  const StoredExpertWeights& stored() const { return weights_; }
  const at::Tensor& globalIds() const { return global_ids_; }
  uint64_t deviceBytes() const { return weights_.bytes(); }

 private:
  std::vector<int64_t> experts_;
  std::vector<int64_t> local_of_;  // [E]: local index of a resident expert, -1 otherwise
  at::Tensor global_ids_;          // [n] int64 host
  StoredExpertWeights weights_;    // on the device
  at::Device device_;
  MemoryCharge charge_;
};

}  // namespace tandem::model
