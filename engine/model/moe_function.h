#pragma once
// The one autograd node behind which the routed experts run on the CPU expert engine.
//
//   forward(hidden [T, H] model dtype on any device, topk_ids [T, k] int64,
//           topk_weights [T, k] fp32) -> routed output [T, H], same dtype and device as hidden
//   backward(dY) -> d hidden, d topk_weights (⟨dY_t, expert_out_t,e⟩, the router's gradient);
//                   expert-LoRA gradients accumulate in the engine's own fp32 buffers.
//
// Only activations cross between the torch device and the CPU; expert weights never move.
// Each call that records a graph owns its ExpertForwardCache, released when the backward ran
// or when the graph is dropped, so recomputation (gradient checkpointing) simply runs forward
// again and nothing is ever reused across micro-batches.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/core/memory_ledger.h"

namespace tandem::experts {
class ExpertForwardCache;
class ExpertLayer;
}  // namespace tandem::experts

namespace tandem::model {

class TorchExpertsCall;

// Gradient checkpointing recomputes a layer in backward; its routed experts are the expensive
// part and they run on the CPU, whose RAM is the plentiful memory. With a KeptExpertForward the
// checkpointed (no-grad) forward keeps the experts' forward cache and output in host RAM, and the
// recomputation reuses them instead of running the experts again, when its inputs (hidden,
// routing) are bitwise the ones kept; anything else runs the experts as usual.
struct KeptExpertForward {
  KeptExpertForward();
  ~KeptExpertForward();
  KeptExpertForward(KeptExpertForward&&) noexcept;
  KeptExpertForward& operator=(KeptExpertForward&&) noexcept;

  // CPU, R rows: every token, or the CPU's (CpuTokens) when resident experts take part. The
  // hidden states are not kept here: the cache holds its own copy and compares against it.
  at::Tensor ids, weights, y;  // ids [R, k] int32, weights [R, k] f32, y [R, H]
  std::unique_ptr<experts::ExpertForwardCache> cache;  // charges itself to the ledger
  MemoryCharge y_charge;                               // y: ("cpu", Activations)
  void clear();
};

// The tokens the CPU engine sees when resident experts take part of the pairs: those with at
// least one pair the others mask (~36 % of 2048 tokens when the CPU has 5 % of the top-8 pairs).
// Only their rows cross to the host and back, and the engine's per-token work (gathers, sums,
// the cached x) shrinks with them.
struct CpuTokens {
  at::Tensor host_rows, rows;  // [R] int64 token indices, ascending: on the host, on the device;
                               // undefined: every token (or none has a CPU pair)

  // ids [T, k] int32 on the host, experts::kMaskedSlot where a pair is computed elsewhere.
  static CpuTokens of(const at::Tensor& ids, at::Device device);
  at::Tensor gather(const at::Tensor& t) const;  // [T, ...] -> [R, ...], on t's device
  // part [R, ...] -> [T, ...] on rows' device: onto + part at its rows (onto undefined: zeros).
  at::Tensor scatter(const at::Tensor& part, int64_t n_tokens, const at::Tensor& onto) const;
};

// Recomputations that reused a kept forward, over the process (for tests and diagnostics).
int64_t reusedExpertForwards();

// `lora_anchor` is a 0-dim fp32 tensor that requires grad whenever the experts carry LoRA: it
// puts this node on the graph even when neither hidden nor the weights need a gradient (e.g.
// when only the experts are trained), so their backward still runs.
// `while_cpu_runs` (optional) is called after the inputs reached the host and before the CPU
// computes: device work it queues (the shared experts) overlaps with the routed experts.
// `keep` (optional; pass it only when training): a forward without grad (the checkpointed pass)
// fills it, the next forward with grad (the recomputation) takes from it.
// `on_device` (optional): the pairs that topk_ids masks (experts::kMaskedSlot), computed with
// torch ops on hidden's device (resident experts). Its forward is queued before the CPU
// computes and its backward before the CPU's backward, both in this one node, so the device
// and the CPU work at once in both directions; the output is the sum of the two parts.
at::Tensor routedExperts(experts::ExpertLayer& layer, const at::Tensor& hidden,
                         const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                         const at::Tensor& lora_anchor,
                         const std::function<void()>& while_cpu_runs = {},
                         KeptExpertForward* keep = nullptr,
                         std::shared_ptr<const TorchExpertsCall> on_device = nullptr);

// The same with several device parts (experts_mode auto: the resident experts' and this step's
// streamed experts'), each computing its own pairs of the masked ones. Every part's prefetch()
// starts first (the streamed weights' copy), then their forwards are queued in order (the
// resident part's compute hides the copy), then the CPU computes; backward likewise.
at::Tensor routedExperts(experts::ExpertLayer& layer, const at::Tensor& hidden,
                         const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                         const at::Tensor& lora_anchor, const std::function<void()>& while_cpu_runs,
                         KeptExpertForward* keep,
                         std::vector<std::shared_ptr<const TorchExpertsCall>> on_device);

}  // namespace tandem::model
