#pragma once
// The SiLU-gated MLP of dense layers and shared experts: down(silu(gate(x)) * up(x)).

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "engine/gpu/attention.h"
#include "engine/gpu/lora_linear.h"

namespace tandem::gpu {

struct GatedMlp {
  LoraLinear gate_proj, up_proj, down_proj;
  // Tokens per chunk over a long sequence (ModelOptions::moe_token_chunk, issue 29): more tokens
  // than this run a chunk at a time, each chunk checkpointed (its [tokens, intermediate] products
  // recomputed in the backward, chunk by chunk), so no product is larger than one chunk's. Same
  // results as one pass: every row is computed alone. 0: one pass whatever the length.
  int64_t token_chunk = 0;

  // x [..., hidden] -> [..., hidden]
  at::Tensor forward(const at::Tensor& x, bool training) const;
  void visitProjections(const ProjectionVisitor& visit);
  bool defined() const { return gate_proj.defined(); }

 private:
  at::Tensor forwardWhole(const at::Tensor& x, bool training) const;
  at::Tensor forwardInChunks(const at::Tensor& rows, bool training) const;
};

}  // namespace tandem::gpu
