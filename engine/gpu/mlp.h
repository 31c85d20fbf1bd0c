#pragma once
// The SiLU-gated MLP of dense layers and shared experts: down(silu(gate(x)) * up(x)).

#include <ATen/core/Tensor.h>

#include "engine/gpu/attention.h"
#include "engine/gpu/lora_linear.h"

namespace tandem::gpu {

struct GatedMlp {
  LoraLinear gate_proj, up_proj, down_proj;

  // x [..., hidden] -> [..., hidden]
  at::Tensor forward(const at::Tensor& x, bool training) const;
  void visitProjections(const ProjectionVisitor& visit);
  bool defined() const { return gate_proj.defined(); }
};

}  // namespace tandem::gpu
