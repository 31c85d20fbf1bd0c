#include "engine/model/decode_session.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <string>

#include "engine/core/error.h"
#include "engine/model/causal_lm.h"
#include "engine/model/decode_session_cpu.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"

namespace tandem::model {

DecodeSession::DecodeSession(const Model& model, int64_t capacity, DecodeStepPath path)
    : model_(model),
      cache_(std::make_unique<KvCache>(model.config().num_hidden_layers, /*batch=*/1, capacity)),
      cpu_step_(path == DecodeStepPath::Auto ? CpuDecodeStep::create(model.lm()) : nullptr) {}

DecodeSession::~DecodeSession() = default;

int64_t DecodeSession::length() const { return cache_->length(); }

std::vector<float> DecodeSession::feed(std::span<const int32_t> ids) {
  if (ids.empty()) throw Error("nothing to feed: the token list is empty");
  c10::InferenceMode inference;
  try {
    if (ids.size() == 1 && cpu_step_ && cpu_step_->takes(*cache_)) {
      return cpu_step_->step(ids[0], *cache_);
    }
    const std::vector<int64_t> wide(ids.begin(), ids.end());
    const at::Tensor input =
        at::tensor(wide, at::kLong).view({1, static_cast<int64_t>(wide.size())});
    const at::Tensor hidden = model_.lm().forwardCached(input, *cache_);
    const at::Tensor logits = model_.lm().logits(hidden.select(1, hidden.size(1) - 1)).select(0, 0);
    const at::Tensor host = logits.to(at::kCPU, at::kFloat).contiguous();
    return std::vector<float>(host.const_data_ptr<float>(),
                              host.const_data_ptr<float>() + host.numel());
  } catch (const c10::OutOfMemoryError& e) {
    const std::string what = e.what_without_backtrace();
    throw OutOfMemory(what.substr(0, what.find('\n')));
  }
}

}  // namespace tandem::model
