#include "engine/model/split_experts.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <utility>

#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_routing.h"
#include "engine/model/moe_function.h"
#include "engine/model/resident_experts.h"
#include "engine/model/torch_experts.h"

namespace tandem::model {

namespace {

// One call's streamed experts: copied from the host copy on the side stream when start() is
// called (before the device work they should overlap is queued), used by the work queued after
// take(). Forward and backward each copy them: nothing of them stays on the device in between.
class StreamedExperts {
 public:
  StreamedExperts(std::shared_ptr<const StoredExpertWeights> host, std::vector<int64_t> experts,
                  at::Device device)
      : host_(std::move(host)), experts_(std::move(experts)), device_(device) {}

  void start() {
    const std::lock_guard lock(mutex_);
    startLocked();
  }

  TorchExpertWeights take() {
    const std::lock_guard lock(mutex_);
    startLocked();
    copy_->join();
    const TorchExpertWeights weights = on_device_->compute();
    // The compute holds the tensors it needs; the next use copies again.
    on_device_.reset();
    copy_.reset();
    return weights;
  }

 private:
  void startLocked() {
    if (on_device_) return;
    c10::InferenceMode not_inference(false);  // a training step may use them
    copy_.emplace(device_);
    on_device_ = host_->gather(experts_, *copy_);
  }

  std::shared_ptr<const StoredExpertWeights> host_;
  std::vector<int64_t> experts_;
  at::Device device_;
  std::mutex mutex_;  // the forward and the autograd engine's thread
  std::optional<gpu::SideCopy> copy_;
  std::optional<StoredExpertWeights> on_device_;
};

// Where each slot of one call goes, as the three consumers want it.
struct SlotPaths {
  at::Tensor resident_local;  // [T, k] int64 host: local index in the cache, -1 elsewhere
  at::Tensor streamed_local;  // [T, k] int64 host: index in the streamed list, -1 elsewhere
  at::Tensor cpu_ids;         // [T, k] int32 host: the expert, kMaskedSlot where the device runs it
  int64_t resident_pairs = 0, streamed_pairs = 0, cpu_pairs = 0;
};

SlotPaths slotPaths(const at::Tensor& ids, const std::vector<int64_t>& resident,
                    const ExpertSplit& split, int64_t num_experts) {
  std::vector<int64_t> resident_of(static_cast<size_t>(num_experts), -1);
  std::vector<int64_t> streamed_of(static_cast<size_t>(num_experts), -1);
  for (size_t i = 0; i < resident.size(); ++i)
    resident_of[static_cast<size_t>(resident[i])] = static_cast<int64_t>(i);
  for (size_t i = 0; i < split.streamed.size(); ++i)
    streamed_of[static_cast<size_t>(split.streamed[i])] = static_cast<int64_t>(i);
  SlotPaths p{at::empty(ids.sizes(), at::kLong), at::empty(ids.sizes(), at::kLong),
              at::empty(ids.sizes(), at::kInt)};
  const int64_t* id = ids.data_ptr<int64_t>();
  int64_t* r = p.resident_local.data_ptr<int64_t>();
  int64_t* s = p.streamed_local.data_ptr<int64_t>();
  int32_t* c = p.cpu_ids.data_ptr<int32_t>();
  for (int64_t slot = 0; slot < ids.numel(); ++slot) {
    const auto e = static_cast<size_t>(id[slot]);
    r[slot] = resident_of[e];
    s[slot] = r[slot] >= 0 ? -1 : streamed_of[e];
    const bool on_cpu = r[slot] < 0 && s[slot] < 0;
    c[slot] = on_cpu ? static_cast<int32_t>(e) : experts::kMaskedSlot;
    p.resident_pairs += r[slot] >= 0;
    p.streamed_pairs += s[slot] >= 0;
    p.cpu_pairs += on_cpu;
  }
  return p;
}

}  // namespace

SplitExperts::SplitExperts(const experts::ExpertLayerSpec& spec,
                           const experts::ExpertWeightViews& views, at::ScalarType dtype,
                           experts::WeightFormat format, at::Device device, int64_t resident_count,
                           int64_t refresh_calls, ExpertSplitChoice choice,
                           const placement::MachineRates& rates)
    : num_experts_(spec.num_experts),
      device_(device),
      resident_count_(std::clamp<int64_t>(resident_count, 0, spec.num_experts)),
      refresh_calls_(refresh_calls),
      since_refresh_(static_cast<size_t>(spec.num_experts), 0) {
  std::vector<int64_t> all(static_cast<size_t>(spec.num_experts));
  std::iota(all.begin(), all.end(), int64_t{0});
  host_ = std::make_shared<const StoredExpertWeights>(StoredExpertWeights::store(
      spec, views, all, dtype, format, at::TensorOptions().pinned_memory(device.is_cuda())));
  host_charge_ =
      MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Weights, host_->bytes());
  policy_ = makeExpertSplitPolicy(
      choice, rates, spec,
      static_cast<double>(host_->bytes()) / static_cast<double>(spec.num_experts),
      experts::weightFormatName(format), device.is_cuda() ? device.index() : 0);
}

SplitExperts::~SplitExperts() {
  if (incoming_ && incoming_->copy) incoming_->copy->join();
}

std::vector<int64_t> SplitExperts::residentExperts() const {
  return resident_ ? resident_->experts() : std::vector<int64_t>();
}

std::shared_ptr<ResidentExperts> SplitExperts::residentOf(const std::vector<int64_t>& experts,
                                                          gpu::SideCopy& copy) const {
  c10::InferenceMode not_inference(false);  // a chat may come first; training may follow
  return std::make_shared<ResidentExperts>(num_experts_, experts, host_->gather(experts, copy),
                                           device_);
}

void SplitExperts::startRefresh() {
  std::vector<int64_t> next = policy_->resident(since_refresh_, resident_count_);
  std::fill(since_refresh_.begin(), since_refresh_.end(), 0);
  if (next == residentExperts()) return;
  c10::InferenceMode not_inference(false);
  Incoming incoming;
  incoming.experts = std::move(next);
  incoming.copy.emplace(device_);
  if (!incoming.experts.empty()) incoming.weights = host_->gather(incoming.experts, *incoming.copy);
  incoming_ = std::move(incoming);
}

void SplitExperts::swapIfRefreshed() {
  if (!incoming_) return;
  incoming_->copy->join();  // the device waits for the copy, if it is still running; the host not
  c10::InferenceMode not_inference(false);
  resident_ = incoming_->experts.empty()
                  ? nullptr
                  : std::make_shared<ResidentExperts>(num_experts_, incoming_->experts,
                                                      std::move(incoming_->weights), device_);
  incoming_.reset();
  ++counts_.refreshes;
}

at::Tensor SplitExperts::forward(experts::ExpertLayer& layer, const at::Tensor& hidden,
                                 const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                                 const at::Tensor& lora_anchor,
                                 const std::function<void()>& while_cpu_runs,
                                 KeptExpertForward* keep) {
  RECORD_USER_SCOPE("tandem::split_experts");
  const at::Tensor ids = topk_ids.to(at::kCPU, at::kLong).contiguous();  // waits for the router
  std::vector<int64_t> pairs(static_cast<size_t>(num_experts_), 0);
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t s = 0; s < ids.numel(); ++s) ++pairs[static_cast<size_t>(id[s])];
  swapIfRefreshed();
  if (!resident_chosen_) {
    resident_chosen_ = true;
    const std::vector<int64_t> first = policy_->resident(pairs, resident_count_);
    if (!first.empty()) {
      gpu::SideCopy copy(device_);
      resident_ = residentOf(first, copy);
      copy.join();
    }
  }
  const std::vector<int64_t> resident = residentExperts();
  const bool graph = torch::autograd::compute_requires_grad(hidden, topk_weights, lora_anchor);
  last_split_ = policy_->split({pairs, resident, graph});
  const SlotPaths paths = slotPaths(ids, resident, last_split_, num_experts_);
  ++counts_.calls;
  counts_.resident_pairs += paths.resident_pairs;
  counts_.streamed_pairs += paths.streamed_pairs;
  counts_.cpu_pairs += paths.cpu_pairs;
  counts_.streamed_experts += static_cast<int64_t>(last_split_.streamed.size());

  experts::ExpertLora& lora = layer.lora();
  std::vector<std::shared_ptr<const TorchExpertsCall>> parts;
  if (paths.streamed_pairs > 0) {
    // Its copy starts before anything else is queued, so the resident experts' work hides it.
    auto streamed = std::make_shared<StreamedExperts>(host_, last_split_.streamed, device_);
    streamed->start();
    auto call = std::make_shared<TorchExpertsCall>(
        [streamed] { return streamed->take(); }, lora, at::tensor(last_split_.streamed, at::kLong),
        groupByExpert(paths.streamed_local, std::ssize(last_split_.streamed), device_));
    call->setPrefetch([streamed] { streamed->start(); });
    parts.push_back(std::move(call));
  }
  if (paths.resident_pairs > 0) {
    std::shared_ptr<const ResidentExperts> cache = resident_;  // alive until the backward ran
    parts.insert(parts.begin(),
                 std::make_shared<const TorchExpertsCall>(
                     [cache] { return cache->stored().compute(); }, lora, cache->globalIds(),
                     groupByExpert(paths.resident_local, std::ssize(resident), device_)));
  }
  if (graph) {
    for (size_t e = 0; e < pairs.size(); ++e) since_refresh_[e] += pairs[e];
    if (refresh_calls_ > 0 && ++graph_calls_ % refresh_calls_ == 0) startRefresh();
  }
  if (paths.cpu_pairs > 0) {
    return routedExperts(layer, hidden, paths.cpu_ids, topk_weights, lora_anchor, while_cpu_runs,
                         keep, std::move(parts));
  }
  // Every pair on the device: the CPU engine is not called, nothing crosses to the host.
  at::Tensor y;
  for (const auto& part : parts) {
    const at::Tensor y_part = torchExperts(*part, hidden, topk_weights, lora_anchor);
    y = y.defined() ? y + y_part : y_part;
  }
  if (while_cpu_runs) while_cpu_runs();
  return y.defined() ? y : at::zeros_like(hidden);  // no token
}

}  // namespace tandem::model
