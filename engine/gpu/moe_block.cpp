#include "engine/gpu/moe_block.h"

#include <ATen/ATen.h>

#include "engine/gpu/moe_function.h"

namespace tandem::gpu {

at::Tensor MoeBlock::forward(const at::Tensor& x, bool training) const {
  const at::Tensor tokens = x.reshape({-1, x.size(-1)});
  const Router::Choice choice = router.route(tokens);
  at::Tensor y = routedExperts(*experts, tokens, choice.ids, choice.weights, lora_anchor);
  if (shared.defined()) {
    at::Tensor shared_out = shared.forward(tokens, training);
    if (shared_gate.defined()) {
      shared_out = at::sigmoid(shared_gate.forward(tokens, training)) * shared_out;
    }
    y = y + shared_out;
  }
  return y.view(x.sizes());
}

}  // namespace tandem::gpu
