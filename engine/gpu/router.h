#pragma once
// Top-k routing of the MoE architectures, exactly as their transformers modeling files do it.
// The router weight is frozen, but the routing weights stay differentiable: the MoE node returns
// d(topk_weights), and autograd carries it through the scores back into the hidden states.

#include <ATen/core/Tensor.h>

#include "engine/gpu/lora_linear.h"
#include "engine/io/model_config.h"

namespace tandem::gpu {

enum class RouterKind {
  QwenSoftmax,     // qwen2_moe / qwen3_moe: softmax, top-k, optional renormalisation
  MixtralSoftmax,  // softmax in fp32, top-k, always renormalised
  DeepseekV2,      // softmax in fp32, greedy or group-limited (max per group) top-k, scaled
  DeepseekV3,      // sigmoid, bias-corrected group-limited (top-2 sum per group) choice, scaled
};

struct Router {
  RouterKind kind = RouterKind::QwenSoftmax;
  LoraLinear gate;             // weight [experts, hidden], model dtype, frozen; LoRA optional
  at::Tensor correction_bias;  // [experts] fp32, DeepSeek-V3 only
  int top_k = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  io::TopkMethod topk_method = io::TopkMethod::Greedy;
  int n_group = 1;
  int topk_group = 1;

  struct Choice {
    at::Tensor ids;      // [tokens, top_k] int64
    at::Tensor weights;  // [tokens, top_k] fp32 (rounded through the model dtype where HF does)
  };
  // x [tokens, hidden] model dtype.
  Choice route(const at::Tensor& x) const;
};

}  // namespace tandem::gpu
