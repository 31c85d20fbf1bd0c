#include "engine/gpu/expert_offload.h"

#include <ATen/ATen.h>

#include <numeric>
#include <vector>

namespace tandem::gpu {

ExpertOffload::ExpertOffload(const experts::ExpertLayerSpec& spec,
                             const experts::ExpertWeightViews& weights, at::ScalarType dtype,
                             at::Device device)
    : device_(device) {
  std::vector<int64_t> all(static_cast<size_t>(spec.num_experts));
  std::iota(all.begin(), all.end(), int64_t{0});
  host_ = stackExpertWeights(spec, weights, all, at::TensorOptions().dtype(dtype).pinned_memory(device.is_cuda()));
  charge_ = MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Weights, host_.bytes());
}

TorchExpertWeights ExpertOffload::stream() const {
  const bool async = device_.is_cuda();
  return {host_.gate.to(device_, /*non_blocking=*/async), host_.up.to(device_, /*non_blocking=*/async),
          host_.down.to(device_, /*non_blocking=*/async)};
}

at::Tensor ExpertOffload::forward(experts::ExpertLora& lora, const at::Tensor& hidden,
                                  const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                                  const at::Tensor& lora_anchor) const {
  ExpertGrouping grouping = groupByExpert(topk_ids.to(at::kCPU, at::kLong), host_.gate.size(0), device_);
  return torchExperts(TorchExpertsCall([this] { return stream(); }, lora, at::Tensor(), std::move(grouping)),
                      hidden, topk_weights, lora_anchor);
}

}  // namespace tandem::gpu
