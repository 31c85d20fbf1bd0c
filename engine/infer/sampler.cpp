#include "engine/infer/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/core/error.h"

namespace tandem::infer {

void validateSettings(const GenerationSettings& s) {
  if (s.max_new_tokens <= 0) throw Error("max_new_tokens must be positive", "give at least 1");
  if (!(s.repetition_penalty > 0) || !std::isfinite(s.repetition_penalty)) {
    throw Error("repetition_penalty must be a positive number", "1.0 means no penalty");
  }
  if (!s.do_sample) return;
  if (!(s.temperature > 0) || !std::isfinite(s.temperature)) {
    throw Error("temperature must be positive when sampling", "use greedy decoding for temperature 0");
  }
  if (!(s.top_p > 0 && s.top_p <= 1)) throw Error("top_p must be in (0, 1]");
  if (s.top_k < 0) throw Error("top_k must not be negative", "0 turns the top-k filter off");
}

at::Tensor processLogits(const at::Tensor& logits, const GenerationSettings& s,
                         std::span<const int32_t> seen) {
  at::Tensor scores = logits.to(at::kFloat).clone();
  const int64_t vocab = scores.size(0);
  if (s.repetition_penalty != 1.0 && !seen.empty()) {
    // score < 0 ? score * penalty : score / penalty, once per distinct token seen.
    std::vector<int64_t> unique(seen.begin(), seen.end());
    std::sort(unique.begin(), unique.end());
    unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
    const at::Tensor ids = at::tensor(unique, at::kLong).to(scores.device());
    const at::Tensor picked = scores.index_select(0, ids);
    scores.index_copy_(0, ids, at::where(picked < 0, picked * s.repetition_penalty,
                                         picked / s.repetition_penalty));
  }
  if (!s.do_sample) return scores;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (s.temperature != 1.0) scores = scores / s.temperature;
  if (s.top_k > 0 && s.top_k < vocab) {
    // Everything below the k-th largest score goes (ties with it stay).
    const at::Tensor kth = std::get<0>(at::topk(scores, s.top_k)).select(0, s.top_k - 1);
    scores = scores.masked_fill(scores < kth, neg_inf);
  }
  if (s.top_p < 1.0) {
    // Ascending sort; drop the low tail whose total probability is <= 1 - top_p, always keeping
    // the most likely token.
    auto [sorted, order] = at::sort(scores, /*dim=*/0, /*descending=*/false);
    const at::Tensor cumulative = at::softmax(sorted, 0).cumsum(0);
    at::Tensor drop_sorted = cumulative <= (1.0 - s.top_p);
    drop_sorted.select(0, vocab - 1).fill_(false);
    const at::Tensor drop = at::zeros_like(drop_sorted).scatter(0, order, drop_sorted);
    scores = scores.masked_fill(drop, neg_inf);
  }
  return scores;
}

Sampler::Sampler(const GenerationSettings& settings, uint64_t seed)
    : settings_(settings), generator_(at::detail::createCPUGenerator(seed)) {
  validateSettings(settings_);
}

int32_t Sampler::next(const at::Tensor& logits, std::span<const int32_t> seen) {
  const at::Tensor scores = processLogits(logits.to(at::kCPU), settings_, seen);
  if (!settings_.do_sample) return static_cast<int32_t>(scores.argmax().item<int64_t>());
  const at::Tensor probs = at::softmax(scores, 0);
  return static_cast<int32_t>(at::multinomial(probs, 1, false, generator_).item<int64_t>());
}

}  // namespace tandem::infer
