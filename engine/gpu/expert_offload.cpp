#include "engine/gpu/expert_offload.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <vector>

namespace tandem::gpu {

ExpertOffload::ExpertOffload(const experts::ExpertLayerSpec& spec,
                             const experts::ExpertWeightViews& weights, at::ScalarType dtype,
                             experts::WeightFormat format, at::Device device, int64_t resident_count)
    : num_experts_(spec.num_experts),
      resident_count_(std::clamp<int64_t>(resident_count, 0, spec.num_experts)),
      device_(device) {
  std::vector<int64_t> all(static_cast<size_t>(spec.num_experts));
  std::iota(all.begin(), all.end(), int64_t{0});
  host_ = StoredExpertWeights::store(spec, weights, all, dtype, format,
                                     at::TensorOptions().pinned_memory(device.is_cuda()));
  charge_ = MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Weights, host_.bytes());
}

std::vector<int64_t> ExpertOffload::residentExperts() const {
  return resident_ ? resident_->experts() : std::vector<int64_t>();
}

int64_t ExpertOffload::streamedExperts() const {
  return resident_ ? static_cast<int64_t>(streamed_.size()) : num_experts_;
}

TorchExpertWeights ExpertOffload::stream() const {
  return host_.to(device_, /*non_blocking=*/device_.is_cuda()).compute();
}

StoredExpertWeights ExpertOffload::streamRest(SideCopy& copy) const { return host_.gather(streamed_, copy); }

void ExpertOffload::makeResident(const at::Tensor& ids) const {
  c10::InferenceMode not_inference(false);  // a chat may come first; training may follow
  const std::vector<int64_t> resident = ResidentExperts::mostRouted(ids, num_experts_, resident_count_);
  streamed_local_.assign(static_cast<size_t>(num_experts_), -1);
  for (int64_t e = 0, r = 0; e < num_experts_; ++e) {
    if (r < static_cast<int64_t>(resident.size()) && resident[static_cast<size_t>(r)] == e) {
      ++r;
      continue;
    }
    streamed_local_[static_cast<size_t>(e)] = static_cast<int64_t>(streamed_.size());
    streamed_.push_back(e);
  }
  streamed_ids_ = at::tensor(streamed_, at::kLong);
  SideCopy copy(device_);
  StoredExpertWeights on_device = host_.gather(resident, copy);
  copy.join();
  resident_ = std::make_unique<ResidentExperts>(num_experts_, resident, std::move(on_device), device_);
}

at::Tensor ExpertOffload::forward(experts::ExpertLora& lora, const at::Tensor& hidden,
                                  const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                                  const at::Tensor& lora_anchor, int64_t* resident_pairs) const {
  const at::Tensor ids = topk_ids.to(at::kCPU, at::kLong).contiguous();
  if (resident_count_ > 0 && !resident_) makeResident(ids);
  if (!resident_) {
    if (resident_pairs) *resident_pairs = 0;
    ExpertGrouping grouping = groupByExpert(ids, num_experts_, device_);
    return torchExperts(TorchExpertsCall([this] { return stream(); }, lora, at::Tensor(), std::move(grouping)),
                        hidden, topk_weights, lora_anchor);
  }
  ResidentExperts::Split split = resident_->split(ids);
  const int64_t on_resident = ids.numel() - split.cpu_pairs;
  if (resident_pairs) *resident_pairs = on_resident;
  // The streamed experts' copy is queued first, on the side stream: it runs while the device
  // computes the resident experts. A backward that recomputes streams them again.
  struct Prefetch {
    SideCopy copy;
    std::optional<StoredExpertWeights> weights;
  };
  auto prefetch = std::make_shared<Prefetch>(Prefetch{SideCopy(device_), std::nullopt});
  if (split.cpu_pairs > 0) prefetch->weights = streamRest(prefetch->copy);
  at::Tensor y;
  if (on_resident > 0) y = torchExperts(resident_->call(lora, split), hidden, topk_weights, lora_anchor);
  if (split.cpu_pairs == 0 && y.defined()) return y;
  auto weights = [this, prefetch] {
    if (!prefetch->weights) {
      SideCopy copy(device_);
      const StoredExpertWeights streamed = streamRest(copy);
      copy.join();
      return streamed.compute();
    }
    prefetch->copy.join();
    const TorchExpertWeights w = prefetch->weights->compute();
    prefetch->weights.reset();
    return w;
  };
  at::Tensor streamed_local = at::empty(ids.sizes(), at::kLong);
  const int64_t* id = ids.data_ptr<int64_t>();
  int64_t* local = streamed_local.data_ptr<int64_t>();
  for (int64_t s = 0; s < ids.numel(); ++s) local[s] = streamed_local_[static_cast<size_t>(id[s])];
  ExpertGrouping grouping = groupByExpert(streamed_local, static_cast<int64_t>(streamed_.size()), device_);
  const at::Tensor y_streamed = torchExperts(TorchExpertsCall(weights, lora, streamed_ids_, std::move(grouping)),
                                             hidden, topk_weights, lora_anchor);
  return y.defined() ? y + y_streamed : y_streamed;
}

}  // namespace tandem::gpu
