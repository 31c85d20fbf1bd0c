#pragma once
// Greedy decoding on a CausalLm, enough for the built-in demo and quick checks. Each new token
// re-runs the whole sequence (no KV cache yet): fine for short answers on small models; the
// chat/serve issue replaces it with prefill + cached decode.

#include <cstdint>
#include <functional>
#include <stop_token>
#include <vector>

namespace tandem::gpu {
class CausalLm;
}

namespace tandem::infer {

struct GreedySettings {
  int64_t max_new_tokens = 64;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
};

// prompt: token ids; returns the generated ids (without the prompt, with the stop token if hit).
// on_token, when set, sees each id as it is produced (streaming).
std::vector<int32_t> generateGreedy(const gpu::CausalLm& model, const std::vector<int32_t>& prompt,
                                    const GreedySettings& settings,
                                    const std::function<void(int32_t)>& on_token = {},
                                    std::stop_token stop = {});

}  // namespace tandem::infer
