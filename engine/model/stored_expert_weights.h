#pragma once
// How n experts' frozen weights are kept between calls by the torch-side experts (resident on a
// GPU, or in offload mode's pinned host copy), as experts_format says:
//   Bf16 (and auto): in the model dtype (fp8 checkpoints dequantised with their block scales);
//   Int8: int8 quantised per output row with fp32 scales, exactly as the CPU expert engine
//     quantises its int8 packs (kernels::quantiseRowsInt8 on the f32 weights), so every device
//     multiplies the same weights. Half the bytes a GPU holds per resident expert and half what
//     offload mode streams per layer. Each call casts the int8 values to the model dtype on the
//     device (exact, int8_cast.h; once in forward, once in backward: a transient copy of the
//     layer's experts, never kept) and torch_experts applies the scales to the products' outputs.
//     (Dequantising q · scale into the weights instead took half of a V2-Lite step's GPU time on
//     an H200: one mixed-dtype broadcast kernel over every weight, three times a step.)
//   Int4: the CPU engine's Tandem int4 tables (experts/expert_blocks.h; group and symmetry from
//     the views' Int4Spec, which the builder sets to experts_format's), made by the CPU engine's
//     own quantiseInt4 from the same f32 weights (INT4 views of that spec: copied as they are), so
//     every device multiplies the same weights. A quarter of the model dtype's bytes (+ one f16
//     scale per group, and a minimum when asymmetric: 0.5625 bytes a weight at group 32): what a
//     GPU holds per resident expert and what offload mode streams per layer, as packed bytes. Each
//     call dequantises them on the device into the model dtype (int4_dequant.h, a CUDA kernel: fp32
//     exactly the CPU engine's weights, bf16 their rounding, as its bf16 block backends decode
//     them), once in forward and once in backward, a transient copy never kept. Group scales lie
//     along the inputs, so unlike int8's they cannot move to the outputs.
//     GGUF files: offload mode and resident experts get the file's experts dequantised at load
//     (the model dtype); experts_format int4 requantises those, so a Q4_K file is multiplied as
//     Tandem int4 (a second rounding of the weights), the same on every device. Carrying Q4_K
//     blocks to the GPU as they are would need a Q4_K kernel here (docs/placement_runtime.md).

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "engine/experts/expert_types.h"
#include "engine/gpu/side_copy.h"
#include "engine/model/torch_experts.h"

namespace tandem::model {

class StoredExpertWeights {
 public:
  StoredExpertWeights() = default;

  // The listed experts of `views`, computed in `dtype`, kept in `format` where `where` says
  // (device, pinned host memory; its dtype is ignored). In the model dtype one expert at a time,
  // with no host copy of them all on the way to a device; in int8 and int4 through host memory
  // (the quantised experts, then one copy to the device). int4: in views.int4's group and
  // symmetry.
  static StoredExpertWeights store(const experts::ExpertLayerSpec& spec,
                                   const experts::ExpertWeightViews& views,
                                   const std::vector<int64_t>& experts, at::ScalarType dtype,
                                   experts::WeightFormat format, const at::TensorOptions& where);

  // A copy on `device` (asynchronous from pinned memory when non_blocking).
  StoredExpertWeights to(at::Device device, bool non_blocking) const;
  // The listed experts (indices into this store, ascending) on copy's device, copied straight
  // from this store's (pinned) host memory by `copy` (side_copy.h; usable once it joined), one
  // copy per run of consecutive experts: no host copy of them on the way (pinned memory freed
  // to torch's caching host allocator is kept there, not returned).
  StoredExpertWeights gather(const std::vector<int64_t>& experts, gpu::SideCopy& copy) const;

  // Reorders the experts of this host store in place: position i gets the expert that was at
  // position order[i] (a permutation of 0..experts()-1). Offload mode puts the experts it streams
  // first, so each call copies one run per tensor.
  void permute(const std::vector<int64_t>& order);

  // The weights to multiply with, in the compute dtype on this copy's device: the stored tensors
  // themselves, or (int8) their values cast, with the row scales, or (int4) the tables
  // dequantised.
  TorchExpertWeights compute() const;

  // int8: the shapes and dtypes of n experts' q (gate, up, down) then row scales (same order),
  // kept in one host block (gpu::carveHostBlock; the planner sizes the host copy by it).
  static std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> int8Shapes(
      int64_t n, int64_t hidden, int64_t intermediate);

  bool int8() const { return stored_.gate_scale.defined(); }
  bool int4() const { return int4_group_ > 0; }
  int64_t experts() const { return stored_.gate.size(0); }
  uint64_t bytes() const { return stored_.bytes(); }

 private:
  // A copy with `each` applied to every stored tensor.
  StoredExpertWeights with(const std::function<at::Tensor(const at::Tensor&)>& each) const;

  // Int4 tables of n experts' [n, I, H] / [n, H, I] weights into stored_ (experts, with (asym) or
  // without a minimum per group), from host memory.
  static StoredExpertWeights storeInt4(const experts::ExpertLayerSpec& spec,
                                       const experts::ExpertWeightViews& views,
                                       const std::vector<int64_t>& experts, at::ScalarType dtype,
                                       const at::TensorOptions& where);

  // compute dtype; int8 with fp32 row scales; or int4 tables, uint8 gate, up [n, I, H/G · block
  // bytes], down [n, H, I/G · block bytes]
  TorchExpertWeights stored_;
  at::ScalarType dtype_ = at::kFloat;  // the compute dtype
  int int4_group_ = 0;                 // int4: weights per group (0: not int4)
  bool int4_symmetric_ = true;
  int64_t hidden_ = 0, intermediate_ = 0;  // H, I: the int4 tables' row lengths in weights
};

}  // namespace tandem::model
