#include "engine/model/expert_offload.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

namespace tandem::model {

ExpertOffload::ExpertOffload(const experts::ExpertLayerSpec& spec,
                             const experts::ExpertWeightViews& weights, at::ScalarType dtype,
                             experts::WeightFormat format, std::shared_ptr<ExpertStreamer> streamer,
                             int64_t resident_count)
    : num_experts_(spec.num_experts),
      resident_count_(std::clamp<int64_t>(resident_count, 0, spec.num_experts)),
      device_(streamer->device()),
      streamer_(std::move(streamer)) {
  std::vector<int64_t> all(static_cast<size_t>(spec.num_experts));
  std::iota(all.begin(), all.end(), int64_t{0});
  host_ = StoredExpertWeights::store(spec, weights, all, dtype, format,
                                     at::TensorOptions().pinned_memory(device_.is_cuda()));
  charge_ = MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Weights, host_.bytes());
  if (resident_count_ == 0) streamed_ = std::move(all);
  stream_index_ = streamer_->add([this](gpu::SideCopy& copy) { return streamed(copy); });
}

std::vector<int64_t> ExpertOffload::residentExperts() const {
  return resident_ ? resident_->experts() : std::vector<int64_t>();
}

int64_t ExpertOffload::streamedExperts() const {
  return resident_count_ > 0 && !resident_ ? num_experts_ : static_cast<int64_t>(streamed_.size());
}

std::optional<StoredExpertWeights> ExpertOffload::streamed(gpu::SideCopy& copy) const {
  if (resident_count_ > 0 && !resident_) return std::nullopt;
  std::vector<int64_t> first(streamed_.size());  // where host_ keeps them
  std::iota(first.begin(), first.end(), int64_t{0});
  return host_.gather(first, copy);
}

void ExpertOffload::makeResident(const at::Tensor& ids) const {
  c10::InferenceMode not_inference(false);  // a chat may come first; training may follow
  const std::vector<int64_t> resident =
      ResidentExperts::mostRouted(ids, num_experts_, resident_count_);
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
  // The streamed experts first in the host copy: each call then copies one run per tensor, not
  // one per run of consecutive streamed experts (hundreds of small copies a layer, each costing
  // the host a few microseconds while the device waited on it).
  std::vector<int64_t> order = streamed_;
  order.insert(order.end(), resident.begin(), resident.end());
  host_.permute(order);
  std::vector<int64_t> resident_rows(resident.size());
  std::iota(resident_rows.begin(), resident_rows.end(), static_cast<int64_t>(streamed_.size()));
  gpu::SideCopy copy(device_);
  StoredExpertWeights on_device = host_.gather(resident_rows, copy);
  copy.join();
  resident_ =
      std::make_unique<ResidentExperts>(num_experts_, resident, std::move(on_device), device_);
}

at::Tensor ExpertOffload::forward(experts::ExpertLora& lora, const at::Tensor& hidden,
                                  const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                                  const at::Tensor& lora_anchor, int64_t* resident_pairs) const {
  const at::Tensor ids = topk_ids.to(at::kCPU, at::kLong).contiguous();
  if (resident_count_ > 0 && !resident_) makeResident(ids);
  at::Tensor y;             // the resident experts' part
  at::Tensor streamed_ids;  // [T, k] int64 host: the streamed experts' local index, -1 elsewhere
  int64_t on_resident = 0;
  if (resident_) {
    ResidentExperts::Split split = resident_->split(ids, /*with_cpu_ids=*/false, token_chunk_);
    on_resident = ids.numel() - split.other_pairs;
    // The streamed experts' copy first (unless it is on its way): it runs while the device
    // computes the resident ones.
    if (split.other_pairs > 0) streamer_->start(stream_index_);
    if (on_resident > 0)
      y = torchExperts(resident_->call(lora, split), hidden, topk_weights, lora_anchor);
    if (split.other_pairs == 0 && y.defined()) {
      if (resident_pairs) *resident_pairs = on_resident;
      return y;
    }
    streamed_ids = at::empty(ids.sizes(), at::kLong);
    const int64_t* id = ids.data_ptr<int64_t>();
    int64_t* local = streamed_ids.data_ptr<int64_t>();
    for (int64_t s = 0; s < ids.numel(); ++s)
      local[s] = streamed_local_[static_cast<size_t>(id[s])];
  } else {
    streamed_ids = ids;
  }
  if (resident_pairs) *resident_pairs = on_resident;
  std::vector<ExpertGrouping> chunks = groupByExpertPerChunk(
      streamed_ids, static_cast<int64_t>(streamed_.size()), device_, token_chunk_);
  // Called in forward, and again in a backward that recomputes: the streamer copies ahead.
  // Once per pass, whatever the chunks.
  auto weights = [this] { return streamer_->take(stream_index_).compute(); };
  const at::Tensor y_streamed =
      torchExperts(TorchExpertsCall(weights, lora, streamed_ids_, std::move(chunks), token_chunk_),
                   hidden, topk_weights, lora_anchor);
  return y.defined() ? y + y_streamed : y_streamed;
}

}  // namespace tandem::model
