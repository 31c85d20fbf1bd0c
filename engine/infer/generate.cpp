#include "engine/infer/generate.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "engine/core/error.h"
#include "engine/gpu/causal_lm.h"

namespace tandem::infer {

std::vector<int32_t> generateGreedy(const gpu::CausalLm& model, const std::vector<int32_t>& prompt,
                                    const GreedySettings& settings,
                                    const std::function<void(int32_t)>& on_token,
                                    std::stop_token stop) {
  if (prompt.empty()) throw Error("cannot generate from an empty prompt");
  at::NoGradGuard no_grad;
  std::vector<int64_t> sequence(prompt.begin(), prompt.end());
  std::vector<int32_t> generated;
  for (int64_t i = 0; i < settings.max_new_tokens && !stop.stop_requested(); ++i) {
    const at::Tensor ids = at::from_blob(sequence.data(), {1, static_cast<int64_t>(sequence.size())},
                                         at::kLong);
    const at::Tensor hidden = model.forwardHidden(ids, /*training=*/false);
    const at::Tensor last = hidden.select(1, hidden.size(1) - 1);  // [1, hidden]
    const int32_t next = static_cast<int32_t>(model.logits(last).argmax(-1).item<int64_t>());
    generated.push_back(next);
    sequence.push_back(next);
    if (on_token) on_token(next);
    if (std::find(settings.stop_ids.begin(), settings.stop_ids.end(), next) != settings.stop_ids.end()) break;
  }
  return generated;
}

}  // namespace tandem::infer
