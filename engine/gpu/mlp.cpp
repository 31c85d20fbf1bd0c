#include "engine/gpu/mlp.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <vector>

#include "engine/gpu/chunked_loss.h"

namespace tandem::gpu {

at::Tensor GatedMlp::forward(const at::Tensor& x, bool training) const {
  const int64_t tokens = x.size(-1) > 0 ? x.numel() / x.size(-1) : 0;
  if (token_chunk <= 0 || tokens <= token_chunk) return forwardWhole(x, training);
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = down_proj.outFeatures();
  return forwardInChunks(x.reshape({tokens, x.size(-1)}), training).view(out_shape);
}

at::Tensor GatedMlp::forwardWhole(const at::Tensor& x, bool training) const {
  return down_proj.forward(at::silu(gate_proj.forward(x, training)) * up_proj.forward(x, training),
                           training);
}

// rows [T, hidden] -> [T, hidden], T > token_chunk.
at::Tensor GatedMlp::forwardInChunks(const at::Tensor& rows, bool training) const {
  // An attached adapter's A and B are leaves that require grad (lora_linear.h).
  const bool trainable = gate_proj.hasLora() || up_proj.hasLora() || down_proj.hasLora();
  // A chunk whose backward is needed is checkpointed; its input then must carry grad for the
  // recomputation's LoRA weights to get theirs (as CausalLm's checkpointed layers).
  const bool backward_follows = c10::GradMode::is_enabled() && (rows.requires_grad() || trainable);
  auto chunk_forward = [this, training](const at::Tensor& chunk) {
    return forwardWhole(chunk, training);
  };
  const int64_t tokens = rows.size(0);
  std::vector<at::Tensor> outputs;
  outputs.reserve(static_cast<size_t>((tokens + token_chunk - 1) / token_chunk));
  for (int64_t begin = 0; begin < tokens; begin += token_chunk) {
    const at::Tensor chunk = rows.narrow(0, begin, std::min(token_chunk, tokens - begin));
    if (!backward_follows) {
      outputs.push_back(forwardWhole(chunk, training));
      continue;
    }
    outputs.push_back(checkpointed(
        chunk_forward, chunk.requires_grad() ? chunk : chunk.detach().requires_grad_(true)));
  }
  return at::cat(outputs);
}

void GatedMlp::visitProjections(const ProjectionVisitor& visit) {
  visit("gate_proj", gate_proj);
  visit("up_proj", up_proj);
  visit("down_proj", down_proj);
}

}  // namespace tandem::gpu
