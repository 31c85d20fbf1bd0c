#include "engine/model/resident_experts.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "engine/experts/expert_routing.h"

namespace tandem::model {

ResidentExperts::ResidentExperts(const experts::ExpertLayerSpec& spec,
                                 const experts::ExpertWeightViews& views,
                                 std::vector<int64_t> experts, at::ScalarType dtype,
                                 experts::WeightFormat format, at::Device device)
    : ResidentExperts(
          spec.num_experts, experts,
          // Normal tensors even when the first call is a chat's (inference mode):
          // training may follow.
          [&] {
            c10::InferenceMode not_inference(false);
            return StoredExpertWeights::store(spec, views, experts, dtype, format,
                                              at::TensorOptions().device(device));
          }(),
          device) {}

ResidentExperts::ResidentExperts(int64_t num_experts, std::vector<int64_t> experts,
                                 StoredExpertWeights on_device, at::Device device)
    : experts_(std::move(experts)),
      local_of_(static_cast<size_t>(num_experts), -1),
      weights_(std::move(on_device)),
      device_(device) {
  c10::InferenceMode not_inference(false);
  for (size_t i = 0; i < experts_.size(); ++i)
    local_of_[static_cast<size_t>(experts_[i])] = static_cast<int64_t>(i);
  global_ids_ = at::tensor(experts_, at::kLong);
  charge_ =
      MemoryCharge(MemoryLedger::global(), device.str(), MemoryCategory::Weights, weights_.bytes());
}

std::vector<int64_t> ResidentExperts::mostRouted(const at::Tensor& ids, int64_t num_experts,
                                                 int64_t count) {
  const at::Tensor flat = ids.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> slots(static_cast<size_t>(num_experts), 0);
  const int64_t* id = flat.data_ptr<int64_t>();
  for (int64_t s = 0; s < flat.numel(); ++s) ++slots[static_cast<size_t>(id[s])];
  std::vector<int64_t> order(static_cast<size_t>(num_experts));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return slots[static_cast<size_t>(a)] > slots[static_cast<size_t>(b)];
  });
  order.resize(static_cast<size_t>(std::clamp<int64_t>(count, 0, num_experts)));
  std::sort(order.begin(), order.end());
  return order;
}

ResidentExperts::Split ResidentExperts::split(const at::Tensor& ids, bool with_cpu_ids,
                                              int64_t chunk_tokens) const {
  const at::Tensor global = ids.to(at::kCPU, at::kLong).contiguous();
  at::Tensor cpu_ids = with_cpu_ids ? at::empty(global.sizes(), at::kInt) : at::Tensor();
  at::Tensor local = at::empty(global.sizes(), at::kLong);
  const int64_t* g = global.data_ptr<int64_t>();
  int32_t* c = with_cpu_ids ? cpu_ids.data_ptr<int32_t>() : nullptr;
  int64_t* l = local.data_ptr<int64_t>();
  int64_t other_pairs = 0;
  for (int64_t s = 0; s < global.numel(); ++s) {
    l[s] = local_of_[static_cast<size_t>(g[s])];
    if (c) c[s] = l[s] >= 0 ? experts::kMaskedSlot : static_cast<int32_t>(g[s]);
    other_pairs += l[s] < 0;
  }
  const auto n = static_cast<int64_t>(experts_.size());
  if (chunk_tokens > 0 && chunk_tokens < global.size(0)) {
    Split chunked{cpu_ids, other_pairs, {}, {}, chunk_tokens};
    chunked.chunks = groupByExpertPerChunk(local, n, device_, chunk_tokens);
    return chunked;
  }
  return {cpu_ids, other_pairs, groupByExpert(local, n, device_)};
}

TorchExpertsCall ResidentExperts::call(experts::ExpertLora& lora, Split& split) const {
  if (!split.chunks.empty()) {
    return TorchExpertsCall([this] { return weights_.compute(); }, lora, global_ids_,
                            std::move(split.chunks), split.chunk_tokens);
  }
  return TorchExpertsCall([this] { return weights_.compute(); }, lora, global_ids_,
                          std::move(split.grouping));
}

}  // namespace tandem::model
