#pragma once
// The decode loop on a Model: one prefill of the prompt into a KV cache, then one cached step
// per new token (model::DecodeSession), each picked by the Sampler (greedy or
// LLaMA-Factory-style sampling). Runs without autograd; the MoE blocks call the expert engine
// with no forward cache.
// Generator (generator.h) adds templates, text streaming, stop strings and adapters on top.

#include <cstdint>
#include <functional>
#include <span>
#include <stop_token>
#include <vector>

#include "engine/infer/generator.h"

namespace tandem::model {
class Model;
}

namespace tandem::infer {

struct TokenOutcome {
  std::vector<int32_t> ids;  // generated ids, with the stop token when one ended it
  FinishReason finish_reason = FinishReason::Length;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  // CPU seconds of the whole process (all threads) over the decode steps, or -1 where not measured
  // (Windows): the benches' figure on a shared machine, where wall time also counts other
  // processes.
  double decode_cpu_seconds = -1;
};

// Sees each new id; returns false to end generation there (a stop string was completed).
using TokenCallback = std::function<bool(int32_t id)>;

// prompt: token ids (non-empty). Ends on a `stop_ids` token (when settings.stop_on_eos), at
// settings.max_new_tokens, when on_token says so (Stop) or when `stop` is requested
// (Cancelled, checked before every step). `seed` drives the sampler.
TokenOutcome generateTokens(const model::Model& model, std::span<const int32_t> prompt,
                            const GenerationSettings& settings, std::span<const int32_t> stop_ids,
                            uint64_t seed, const TokenCallback& on_token = {},
                            std::stop_token stop = {});

}  // namespace tandem::infer
