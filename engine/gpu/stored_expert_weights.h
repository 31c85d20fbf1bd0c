#pragma once
// How n experts' frozen weights are kept between calls by the torch-side experts (resident on a
// GPU, or in offload mode's pinned host copy), as experts_format says:
//   Bf16 (and auto): in the model dtype (fp8 checkpoints dequantised with their block scales);
//   Int8: int8 quantised per output row with fp32 scales, exactly as the CPU expert engine
//     quantises its int8 packs (kernels::quantiseRowsInt8 on the f32 weights), so every device
//     multiplies the same weights. Half the bytes a GPU holds per resident expert and half what
//     offload mode streams per layer. Each call dequantises them (q · scale) into the model dtype
//     on the device, once in forward and once in backward: a transient copy of the layer's
//     experts in the model dtype, never kept.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <vector>

#include "engine/experts/expert_types.h"
#include "engine/gpu/torch_experts.h"

namespace tandem::gpu {

class StoredExpertWeights {
 public:
  StoredExpertWeights() = default;

  // The listed experts of `views`, computed in `dtype`, kept in `format` where `where` says
  // (device, pinned host memory; its dtype is ignored). One expert at a time: no second host copy
  // of them all on the way to a device.
  static StoredExpertWeights store(const experts::ExpertLayerSpec& spec, const experts::ExpertWeightViews& views,
                                   const std::vector<int64_t>& experts, at::ScalarType dtype,
                                   experts::WeightFormat format, const at::TensorOptions& where);

  // A copy on `device` (asynchronous from pinned memory when non_blocking).
  StoredExpertWeights to(at::Device device, bool non_blocking) const;

  // The weights to multiply with, in the compute dtype on this copy's device: the stored tensors
  // themselves, or (int8) a dequantised copy.
  TorchExpertWeights compute() const;

  bool int8() const { return gate_scale_.defined(); }
  int64_t experts() const { return values_.gate.size(0); }
  uint64_t bytes() const;  // values and scales as held

 private:
  TorchExpertWeights values_;                         // compute dtype, or int8
  at::Tensor gate_scale_, up_scale_, down_scale_;     // int8: [n, I], [n, I], [n, H] fp32
  at::ScalarType dtype_ = at::kFloat;                 // the compute dtype
};

}  // namespace tandem::gpu
