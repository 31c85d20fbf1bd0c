#pragma once
// experts_mode: auto, one MoE layer's routed experts split three ways per call, after routing is
// known (expert_split.h decides): the resident cache's experts computed on the layer's device,
// this call's streamed experts copied from a pinned host copy of every expert on the side copy
// stream (side_copy.h) and computed on the device, the rest on the CPU expert engine. All of it
// runs in one autograd node (routedExperts, moe_function.h): forward queues the copy, then the
// resident and the streamed experts' device work, then the CPU engine computes, then they join;
// backward starts the copy again (the streamed weights are not kept between forward and
// backward), queues the device's backward and runs the CPU engine's meanwhile.
//
// The resident cache follows the routing: every `refresh_calls` calls that build a graph (one per
// micro-batch) the policy picks its next content from the pairs routed since the last refresh;
// the incoming experts are copied on the side stream and the cache swaps at the next call, whose
// device work waits for that copy on the device (the host never does). A call keeps the cache it
// used alive until its backward ran, so a swap between a forward and its backward is harmless.
//
// The CPU engine packs every expert (any of them may be the CPU's on some call), and the host
// keeps one more copy of them all to stream from (pinned on a GPU).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/experts/expert_types.h"
#include "engine/gpu/side_copy.h"
#include "engine/model/expert_split.h"
#include "engine/model/stored_expert_weights.h"

namespace tandem::experts {
class ExpertLayer;
}

namespace tandem::model {

struct KeptExpertForward;
class ResidentExperts;

class SplitExperts {
 public:
  // views as the CPU engine reads them (fp8 dequantised), kept in `format` and computed in
  // `dtype` on `device`; resident_count: the cache's size (ModelOptions::gpu_experts). The split
  // `choice` prices the experts with `rates` (the device's GPU terms: cuda:i's, the first GPU's
  // on the CPU device).
  SplitExperts(const experts::ExpertLayerSpec& spec, const experts::ExpertWeightViews& views,
               at::ScalarType dtype, experts::WeightFormat format, at::Device device,
               int64_t resident_count, int64_t refresh_calls, ExpertSplitChoice choice,
               const placement::MachineRates& rates);
  ~SplitExperts();
  SplitExperts(const SplitExperts&) = delete;
  SplitExperts& operator=(const SplitExperts&) = delete;

  // As routedExperts (moe_function.h): hidden [T, H] on the device, topk_ids [T, k] (any
  // device, int64), topk_weights [T, k] fp32 -> [T, H]. The CPU engine's part runs on `layer`,
  // which also holds every expert's LoRA.
  at::Tensor forward(experts::ExpertLayer& layer, const at::Tensor& hidden,
                     const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                     const at::Tensor& lora_anchor, const std::function<void()>& while_cpu_runs,
                     KeptExpertForward* keep);

  // (token, slot) pairs of every call so far, by where they ran.
  struct Counts {
    int64_t calls = 0;
    int64_t resident_pairs = 0, streamed_pairs = 0, cpu_pairs = 0;
    int64_t streamed_experts = 0;  // summed over calls
    int64_t refreshes = 0;         // resident cache swaps after the first
  };
  Counts counts() const { return counts_; }
  std::vector<int64_t> residentExperts() const;
  const ExpertSplit& lastSplit() const { return last_split_; }

 private:
  // Copies `experts` (ascending) from the host copy to the device with `copy`.
  std::shared_ptr<ResidentExperts> residentOf(const std::vector<int64_t>& experts,
                                              gpu::SideCopy& copy) const;
  void startRefresh();
  void swapIfRefreshed();

  int64_t num_experts_;
  at::Device device_;
  int64_t resident_count_;
  int64_t refresh_calls_;
  std::unique_ptr<ExpertSplitPolicy> policy_;
  std::shared_ptr<const StoredExpertWeights> host_;  // every expert, by id; pinned on a GPU
  MemoryCharge host_charge_;
  std::shared_ptr<ResidentExperts> resident_;  // null: none yet, or an empty cache
  bool resident_chosen_ = false;
  struct Incoming {
    std::vector<int64_t> experts;
    std::optional<gpu::SideCopy> copy;
    StoredExpertWeights weights;
  };
  std::optional<Incoming> incoming_;    // the next cache, on its way
  std::vector<int64_t> since_refresh_;  // [E] pairs routed since the last refresh
  int64_t graph_calls_ = 0;
  Counts counts_;
  ExpertSplit last_split_;
};

}  // namespace tandem::model
