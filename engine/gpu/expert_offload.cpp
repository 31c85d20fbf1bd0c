#include "engine/gpu/expert_offload.h"

#include <ATen/ATen.h>

#include <numeric>
#include <vector>

namespace tandem::gpu {

ExpertOffload::ExpertOffload(const experts::ExpertLayerSpec& spec,
                             const experts::ExpertWeightViews& weights, at::ScalarType dtype,
                             experts::WeightFormat format, at::Device device)
    : device_(device) {
  std::vector<int64_t> all(static_cast<size_t>(spec.num_experts));
  std::iota(all.begin(), all.end(), int64_t{0});
  host_ = StoredExpertWeights::store(spec, weights, all, dtype, format,
                                     at::TensorOptions().pinned_memory(device.is_cuda()));
  charge_ = MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Weights, host_.bytes());
}

TorchExpertWeights ExpertOffload::stream() const {
  return host_.to(device_, /*non_blocking=*/device_.is_cuda()).compute();
}

at::Tensor ExpertOffload::forward(experts::ExpertLora& lora, const at::Tensor& hidden,
                                  const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                                  const at::Tensor& lora_anchor) const {
  ExpertGrouping grouping = groupByExpert(topk_ids.to(at::kCPU, at::kLong), host_.experts(), device_);
  return torchExperts(TorchExpertsCall([this] { return stream(); }, lora, at::Tensor(), std::move(grouping)),
                      hidden, topk_weights, lora_anchor);
}

}  // namespace tandem::gpu
