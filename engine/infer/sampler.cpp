#include "engine/infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/core/error.h"

namespace tandem::infer {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// score < 0 ? score * penalty : score / penalty, once per distinct token seen.
void penaliseRepeats(std::vector<float>& scores, double penalty, std::span<const int32_t> seen) {
  std::vector<int32_t> unique(seen.begin(), seen.end());
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  const auto p = static_cast<float>(penalty);
  for (const int32_t id : unique) {
    if (id < 0 || static_cast<size_t>(id) >= scores.size()) continue;
    float& s = scores[static_cast<size_t>(id)];
    s = s < 0 ? s * p : s / p;
  }
}

// Everything below the k-th largest score goes (ties with it stay).
void keepTopK(std::vector<float>& scores, int64_t k) {
  std::vector<float> sorted = scores;
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
  const float kth = sorted[static_cast<size_t>(k - 1)];
  for (float& s : scores) {
    if (s < kth) s = kNegInf;
  }
}

// softmax(scores) in double; -inf entries get 0.
std::vector<double> probabilities(const std::vector<float>& scores) {
  const float max = *std::max_element(scores.begin(), scores.end());
  std::vector<double> probs(scores.size());
  double sum = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    probs[i] = std::exp(static_cast<double>(scores[i]) - max);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;
  return probs;
}

// Ascending order; drop the low tail whose total probability is <= 1 - top_p, always keeping
// the most likely token.
void keepTopP(std::vector<float>& scores, double top_p) {
  const std::vector<double> probs = probabilities(scores);
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double mass = 0;
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    mass += probs[order[i]];
    if (mass <= 1.0 - top_p) scores[order[i]] = kNegInf;
  }
}

}  // namespace

void validateSettings(const GenerationSettings& s) {
  if (s.max_new_tokens <= 0) throw Error("max_new_tokens must be positive", "give at least 1");
  if (!(s.repetition_penalty > 0) || !std::isfinite(s.repetition_penalty)) {
    throw Error("repetition_penalty must be a positive number", "1.0 means no penalty");
  }
  if (!s.do_sample) return;
  if (!(s.temperature > 0) || !std::isfinite(s.temperature)) {
    throw Error("temperature must be positive when sampling",
                "use greedy decoding for temperature 0");
  }
  if (!(s.top_p > 0 && s.top_p <= 1)) throw Error("top_p must be in (0, 1]");
  if (s.top_k < 0) throw Error("top_k must not be negative", "0 turns the top-k filter off");
}

void processLogits(std::vector<float>& scores, const GenerationSettings& s,
                   std::span<const int32_t> seen) {
  if (scores.empty()) throw Error("no logits to pick a token from");
  if (s.repetition_penalty != 1.0 && !seen.empty())
    penaliseRepeats(scores, s.repetition_penalty, seen);
  if (!s.do_sample) return;
  if (s.temperature != 1.0) {
    const auto t = static_cast<float>(s.temperature);
    for (float& v : scores) v /= t;
  }
  if (s.top_k > 0 && s.top_k < static_cast<int64_t>(scores.size())) keepTopK(scores, s.top_k);
  if (s.top_p < 1.0) keepTopP(scores, s.top_p);
}

Sampler::Sampler(const GenerationSettings& settings, uint64_t seed)
    : settings_(settings), rng_(seed) {
  validateSettings(settings_);
}

int32_t Sampler::next(std::vector<float> logits, std::span<const int32_t> seen) {
  processLogits(logits, settings_, seen);
  if (!settings_.do_sample) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  const std::vector<double> probs = probabilities(logits);
  // 53 random bits as a double in [0, 1): the same on every standard library, unlike
  // std::uniform_real_distribution.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  double mass = 0;
  size_t last_possible = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    last_possible = i;
    mass += probs[i];
    if (u < mass) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last_possible);  // rounding left u just above the total
}

}  // namespace tandem::infer
