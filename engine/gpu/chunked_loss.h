#pragma once
// Causal-LM cross entropy without materialising [tokens × vocab] logits: the forward and the
// backward each walk the tokens in chunks, recomputing one chunk of logits at a time.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace tandem::gpu {

class CheckpointOffload;

// hidden [N, H] model dtype (after the final norm), lm_head [V, H] (frozen), targets [N] int64
// (already shifted; -100 = ignored). Returns the mean loss over kept targets as a 0-dim fp32
// tensor (NaN when none is kept, as torch's mean over nothing), differentiable in hidden.
// Logits are computed in the model dtype and upcast to fp32, as transformers does.
at::Tensor chunkedCrossEntropy(const at::Tensor& hidden, const at::Tensor& lm_head,
                               const at::Tensor& targets, int64_t chunk_tokens);

// Runs `layer` without keeping its activations, and again (with grad) during the backward:
// gradient checkpointing for one decoder layer. x [B, S, H] must require grad. With `offload`
// (checkpoint_offload.h) x is kept in host memory until the backward instead of on its device,
// and the backward prefetches the previous layer's input while it runs this one's.
at::Tensor checkpointed(const std::function<at::Tensor(const at::Tensor&)>& layer,
                        const at::Tensor& x,
                        const std::shared_ptr<CheckpointOffload>& offload = nullptr);

// True on the thread where a checkpointed layer is being recomputed for its backward, which
// follows at once: an op whose backward would recompute its own forward (the torch-side experts)
// keeps that forward's graph instead, for as long as this one layer's backward.
bool inCheckpointRecompute();

}  // namespace tandem::gpu
