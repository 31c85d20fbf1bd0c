#include "engine/gpu/router.h"

#include <ATen/ATen.h>

#include <limits>

namespace tandem::gpu {

namespace {

// Keeps the experts of the `topk_group` best groups; the others' scores become `fill`.
at::Tensor maskToBestGroups(const at::Tensor& scores, const at::Tensor& group_scores, int n_group,
                            int topk_group, double fill) {
  const int64_t tokens = scores.size(0), experts = scores.size(1);
  const at::Tensor group_idx = std::get<1>(at::topk(group_scores, topk_group, -1, true, false));
  const at::Tensor group_mask = at::zeros_like(group_scores).scatter_(1, group_idx, 1);
  const at::Tensor score_mask = group_mask.unsqueeze(-1)
                                    .expand({tokens, n_group, experts / n_group})
                                    .reshape({tokens, experts});
  return scores.masked_fill(score_mask.logical_not(), fill);
}

Router::Choice routeQwen(const Router& r, const at::Tensor& x, bool always_normalise,
                         bool round_to_model_dtype) {
  const at::Tensor logits = at::linear(x, r.gate.mergedWeight());
  const at::Tensor probs = at::softmax(logits.to(at::kFloat), -1);
  auto [values, ids] = at::topk(probs, r.top_k, -1);
  if (always_normalise || r.norm_topk_prob) values = values / values.sum(-1, true);
  // qwen casts the routing weights back to the logits' dtype; mixtral keeps fp32.
  if (round_to_model_dtype) values = values.to(logits.scalar_type()).to(at::kFloat);
  return {ids, values};
}

Router::Choice routeDeepseekV2(const Router& r, const at::Tensor& x) {
  const at::Tensor logits = at::linear(x.to(at::kFloat), r.gate.mergedWeight().to(at::kFloat));
  at::Tensor scores = at::softmax(logits, -1);
  if (r.topk_method == io::TopkMethod::GroupLimitedGreedy) {
    const int64_t tokens = scores.size(0), experts = scores.size(1);
    const at::Tensor group_scores =
        std::get<0>(scores.view({tokens, r.n_group, experts / r.n_group}).max(-1));
    scores = maskToBestGroups(scores, group_scores, r.n_group, r.topk_group, 0.0);
  }
  auto [values, ids] = at::topk(scores, r.top_k, -1, true, false);
  return {ids, values * r.routed_scaling_factor};
}

Router::Choice routeDeepseekV3(const Router& r, const at::Tensor& x) {
  const at::Tensor logits = at::linear(x.to(at::kFloat), r.gate.mergedWeight().to(at::kFloat));
  const at::Tensor scores = logits.sigmoid();
  // The bias only steers the choice (aux-loss-free balancing); weights use the raw scores.
  at::Tensor choice = scores.detach() + r.correction_bias;
  const int64_t tokens = scores.size(0), experts = scores.size(1);
  const at::Tensor group_scores =
      std::get<0>(at::topk(choice.view({tokens, r.n_group, experts / r.n_group}), 2, -1)).sum(-1);
  choice = maskToBestGroups(choice, group_scores, r.n_group, r.topk_group,
                            -std::numeric_limits<double>::infinity());
  const at::Tensor ids = std::get<1>(at::topk(choice, r.top_k, -1, true, false));
  at::Tensor weights = scores.gather(1, ids);
  if (r.norm_topk_prob) weights = weights / (weights.sum(-1, true) + 1e-20);
  return {ids, weights * r.routed_scaling_factor};
}

}  // namespace

Router::Choice Router::route(const at::Tensor& x) const {
  switch (kind) {
    case RouterKind::QwenSoftmax: return routeQwen(*this, x, false, true);
    case RouterKind::MixtralSoftmax: return routeQwen(*this, x, true, false);
    case RouterKind::DeepseekV2: return routeDeepseekV2(*this, x);
    case RouterKind::DeepseekV3: return routeDeepseekV3(*this, x);
  }
  return {};
}

}  // namespace tandem::gpu
