#include "engine/infer/generate.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/core/error.h"
#include "engine/model/causal_lm.h"
#include "engine/model/kv_cache.h"
#include "engine/infer/sampler.h"

namespace tandem::infer {

namespace {

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TokenOutcome generateTokens(const model::CausalLm& model, std::span<const int32_t> prompt,
                            const GenerationSettings& settings, std::span<const int32_t> stop_ids,
                            uint64_t seed, const TokenCallback& on_token, std::stop_token stop) {
  if (prompt.empty()) throw Error("cannot generate from an empty prompt");
  validateSettings(settings);
  const int64_t context = model.config().max_position_embeddings;
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (context > 0 && prompt_len >= context) {
    throw Error("the prompt has " + std::to_string(prompt_len) + " tokens; the model's context is " +
                    std::to_string(context),
                "shorten the conversation (/reset in chat)");
  }
  // The answer stops at the model's context, like transformers' max_length.
  int64_t capacity = prompt_len + settings.max_new_tokens;
  if (context > 0) capacity = std::min(capacity, context);
  const int64_t max_new = capacity - prompt_len;

  c10::InferenceMode inference;
  model::KvCache cache(model.config().num_hidden_layers, /*batch=*/1, capacity);
  Sampler sampler(settings, seed);
  std::vector<int32_t> seen(prompt.begin(), prompt.end());
  seen.reserve(seen.size() + static_cast<size_t>(max_new));
  TokenOutcome out;
  if (stop.stop_requested()) {
    out.finish_reason = FinishReason::Cancelled;
    return out;
  }

  auto start = std::chrono::steady_clock::now();
  std::vector<int64_t> prompt_ids(prompt.begin(), prompt.end());
  at::Tensor hidden = model.forwardCached(at::tensor(prompt_ids, at::kLong).view({1, prompt_len}), cache);
  out.prefill_seconds = secondsSince(start);
  start = std::chrono::steady_clock::now();
  at::Tensor next_input = at::empty({1, 1}, at::kLong);
  while (true) {
    const at::Tensor logits = model.logits(hidden.select(1, hidden.size(1) - 1)).select(0, 0);
    const int32_t id = sampler.next(logits, seen);
    out.ids.push_back(id);
    seen.push_back(id);
    const bool is_stop = settings.stop_on_eos &&
                         std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
    const bool keep_going = on_token ? on_token(id) : true;
    if (is_stop || !keep_going) {
      out.finish_reason = FinishReason::Stop;
      break;
    }
    if (static_cast<int64_t>(out.ids.size()) >= max_new) {
      out.finish_reason = FinishReason::Length;
      break;
    }
    if (stop.stop_requested()) {
      out.finish_reason = FinishReason::Cancelled;
      break;
    }
    next_input.fill_(static_cast<int64_t>(id));
    hidden = model.forwardCached(next_input, cache);
  }
  out.decode_seconds = secondsSince(start);
  return out;
}

}  // namespace tandem::infer
