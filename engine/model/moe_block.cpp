#include "engine/model/moe_block.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <vector>

#include "engine/model/moe_function.h"

namespace tandem::model {

at::Tensor MoeBlock::splitForward(const at::Tensor& tokens, const at::Tensor& ids,
                                  const at::Tensor& weights,
                                  const std::function<void()>& run_shared, bool training,
                                  KeptExpertForward& kept_chunk) const {
  const int64_t cpu_pairs_before = split->counts().cpu_pairs;
  const at::Tensor y = split->forward(*experts, tokens, ids, weights, lora_anchor, run_shared,
                                      training && keep_expert_forward ? &kept_chunk : nullptr);
  pairs.resident += ids.numel() - (split->counts().cpu_pairs - cpu_pairs_before);  // the device's
  return y;
}

at::Tensor MoeBlock::forward(const at::Tensor& x, bool training) const {
  RECORD_USER_SCOPE("tandem::moe_block");
  const at::Tensor tokens = x.reshape({-1, x.size(-1)});
  const int64_t n_tokens = tokens.size(0);
  const int64_t chunk = token_chunk > 0 && !offload ? token_chunk : std::max<int64_t>(n_tokens, 1);
  const int64_t n_chunks = std::max<int64_t>((n_tokens + chunk - 1) / chunk, 1);
  // One kept forward per chunk; those of a longer earlier batch are dropped, not held.
  kept.resize(static_cast<size_t>(n_chunks));
  if (n_chunks == 1) return forwardTokens(tokens, training, kept[0]).view(x.sizes());
  // Every row's result depends on that row alone (routing is per token, the experts' products
  // per pair), so the chunks' outputs side by side are the whole block's.
  std::vector<at::Tensor> outputs;
  outputs.reserve(static_cast<size_t>(n_chunks));
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t begin = c * chunk;
    outputs.push_back(forwardTokens(tokens.narrow(0, begin, std::min(chunk, n_tokens - begin)),
                                    training, kept[static_cast<size_t>(c)]));
  }
  return at::cat(outputs).view(x.sizes());
}

at::Tensor MoeBlock::forwardTokens(const at::Tensor& tokens, bool training,
                                   KeptExpertForward& kept_chunk) const {
  const gpu::Router::Choice choice = router.route(tokens);
  if (route_observer) route_observer(choice.ids);
  pairs.routed += choice.ids.numel();
  at::Tensor shared_out;
  auto run_shared = [&] {
    if (!shared.defined()) return;
    shared_out = shared.forward(tokens, training);
    if (shared_gate.defined()) {
      shared_out = at::sigmoid(shared_gate.forward(tokens, training)) * shared_out;
    }
  };
  at::Tensor y;
  if (split) {
    y = splitForward(tokens, choice.ids, choice.weights, run_shared, training, kept_chunk);
  } else if (offload) {
    int64_t resident_pairs = 0;
    y = offload->forward(experts->lora(), tokens, choice.ids, choice.weights, lora_anchor,
                         &resident_pairs);
    pairs.resident += resident_pairs;
    run_shared();
  } else if (resident_count > 0) {
    const at::Tensor ids = choice.ids.to(at::kCPU, at::kLong);  // waits for the router
    if (!resident) {
      resident = std::make_unique<ResidentExperts>(
          experts->spec(), resident_source,
          ResidentExperts::mostRouted(ids, experts->spec().num_experts, resident_count),
          tokens.scalar_type(), resident_format, tokens.device());
      experts->releaseExperts(resident->experts());  // the CPU engine packs the others only
      if (release_resident_source && !experts->readsWeightViews()) {
        resident_source = {};
        release_resident_source();  // nothing reads the views any more
        release_resident_source = nullptr;
      }
    }
    ResidentExperts::Split split = resident->split(ids);
    pairs.resident += ids.numel() - split.other_pairs;
    if (split.other_pairs == 0) {
      // Every pair is resident: nothing goes to the host and the CPU engine is not called.
      y = torchExperts(resident->call(experts->lora(), split), tokens, choice.weights, lora_anchor);
      run_shared();
    } else {
      // The resident experts and the shared experts are queued on the device once the CPU's
      // inputs reached the host: CUDA runs them while the CPU engine computes the other pairs.
      y = routedExperts(
          *experts, tokens, split.cpu_ids, choice.weights, lora_anchor, run_shared,
          training && keep_expert_forward ? &kept_chunk : nullptr,
          std::make_shared<const TorchExpertsCall>(resident->call(experts->lora(), split)));
    }
  } else {
    // The shared experts are launched once the routed experts' inputs reached the host: CUDA
    // runs them while the CPU engine works (a copy to the host before would wait for them).
    y = routedExperts(*experts, tokens, choice.ids, choice.weights, lora_anchor, run_shared,
                      training && keep_expert_forward ? &kept_chunk : nullptr);
  }
  if (shared_out.defined()) y = y + shared_out;
  // In fp32, then back to the model dtype, as a LoRA branch is added (lora_linear.h); inside the
  // layer, so a checkpointed layer's recomputation runs it again.
  if (lora_experts.defined()) y = (y + lora_experts.forward(tokens)).to(y.scalar_type());
  return y;
}

}  // namespace tandem::model
