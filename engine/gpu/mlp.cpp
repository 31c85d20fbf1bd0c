#include "engine/gpu/mlp.h"

#include <ATen/ATen.h>

namespace tandem::gpu {

at::Tensor GatedMlp::forward(const at::Tensor& x, bool training) const {
  return down_proj.forward(at::silu(gate_proj.forward(x, training)) * up_proj.forward(x, training),
                           training);
}

void GatedMlp::visitProjections(const ProjectionVisitor& visit) {
  visit("gate_proj", gate_proj);
  visit("up_proj", up_proj);
  visit("down_proj", down_proj);
}

}  // namespace tandem::gpu
