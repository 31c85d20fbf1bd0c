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

#include <functional>

namespace tandem::experts {
class ExpertLayer;
}

namespace tandem::gpu {

// `lora_anchor` is a 0-dim fp32 tensor that requires grad whenever the experts carry LoRA: it
// puts this node on the graph even when neither hidden nor the weights need a gradient (e.g.
// when only the experts are trained), so their backward still runs.
// `while_cpu_runs` (optional) is called after the inputs reached the host and before the CPU
// computes: device work it queues (the shared experts) overlaps with the routed experts.
at::Tensor routedExperts(experts::ExpertLayer& layer, const at::Tensor& hidden,
                         const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                         const at::Tensor& lora_anchor,
                         const std::function<void()>& while_cpu_runs = {});

}  // namespace tandem::gpu
