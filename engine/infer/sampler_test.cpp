// The Sampler's logit processing against references written here from transformers' definitions
// (generation/logits_process.py), on tiny logits where every case is worked out by hand.

#include "engine/infer/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "engine/core/error.h"

namespace tandem::infer {
namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> processed(std::vector<float> logits, const GenerationSettings& s,
                             std::span<const int32_t> seen) {
  processLogits(logits, s, seen);
  return logits;
}

GenerationSettings sampling(double temperature, double top_p, int64_t top_k) {
  GenerationSettings s;
  s.temperature = temperature;
  s.top_p = top_p;
  s.top_k = top_k;
  return s;
}

TEST(Sampler, DefaultsAreLlamaFactoryGeneratingArguments) {
  const GenerationSettings s;
  EXPECT_TRUE(s.do_sample);
  EXPECT_DOUBLE_EQ(s.temperature, 0.95);
  EXPECT_DOUBLE_EQ(s.top_p, 0.7);
  EXPECT_EQ(s.top_k, 50);
  EXPECT_DOUBLE_EQ(s.repetition_penalty, 1.0);
  EXPECT_EQ(s.max_new_tokens, 1024);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeScoresOfSeenTokens) {
  GenerationSettings s;
  s.do_sample = false;
  s.repetition_penalty = 2.0;
  const std::vector<float> logits = {1.0f, -1.0f, 3.0f, -0.5f, 0.25f};
  const std::vector<int32_t> seen = {0, 1, 1, 4};  // repeats count once
  EXPECT_EQ(processed(logits, s, seen), (std::vector<float>{0.5f, -2.0f, 3.0f, -0.5f, 0.125f}));
}

TEST(Sampler, GreedyIsArgmaxAfterThePenalty) {
  GenerationSettings s;
  s.do_sample = false;
  s.repetition_penalty = 4.0;
  Sampler sampler(s, 1);
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  EXPECT_EQ(sampler.next(logits, {}), 0);
  EXPECT_EQ(sampler.next(logits, std::vector<int32_t>{0}), 1);  // 2 / 4 = 0.5 < 1
}

TEST(Sampler, TemperatureDividesTheScores) {
  const std::vector<float> logits = {1.0f, -2.0f, 0.5f};
  EXPECT_EQ(processed(logits, sampling(0.5, 1.0, 0), {}), (std::vector<float>{2.0f, -4.0f, 1.0f}));
}

TEST(Sampler, TopKKeepsTheKBestAndTiesWithTheKth) {
  const std::vector<float> logits = {0.1f, 0.9f, 0.5f, 0.5f, 0.2f};
  EXPECT_EQ(processed(logits, sampling(1.0, 1.0, 2), {}),
            (std::vector<float>{kNegInf, 0.9f, 0.5f, 0.5f, kNegInf}));
  EXPECT_EQ(processed(logits, sampling(1.0, 1.0, 1), {}),
            (std::vector<float>{kNegInf, 0.9f, kNegInf, kNegInf, kNegInf}));
}

// TopPLogitsWarper written out: keep the smallest set of most likely tokens whose probability
// reaches top_p (a token is dropped when the mass of everything less likely than or as likely
// as it, in ascending order, is <= 1 - top_p), never the most likely one.
std::vector<bool> topPKeepReference(const std::vector<double>& probs, double top_p) {
  std::vector<size_t> order(probs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return probs[a] < probs[b]; });
  std::vector<bool> keep(probs.size(), true);
  double mass = 0;
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    mass += probs[order[i]];
    if (mass <= 1 - top_p) keep[order[i]] = false;
  }
  return keep;
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  const std::vector<float> raw = {std::log(0.05f), std::log(0.4f), std::log(0.15f), std::log(0.3f),
                                  std::log(0.1f)};
  for (double top_p : {0.3, 0.5, 0.72, 0.86, 0.97, 0.999}) {
    const std::vector<float> got = processed(raw, sampling(1.0, top_p, 0), {});
    const std::vector<double> probs = {0.05, 0.4, 0.15, 0.3, 0.1};
    const std::vector<bool> keep = topPKeepReference(probs, top_p);
    for (size_t i = 0; i < raw.size(); ++i) {
      EXPECT_EQ(std::isinf(got[i]), !keep[i]) << "top_p " << top_p << " token " << i;
    }
  }
}

TEST(Sampler, WarpersApplyInTransformersOrder) {
  // temperature first, then top-k, then top-p on the tempered distribution.
  const std::vector<float> got = processed({4.0f, 3.0f, 2.0f, 1.0f}, sampling(2.0, 0.6, 3), {});
  // tempered [2, 1.5, 1, 0.5] -> top-3 drops 0.5 -> softmax over [2, 1.5, 1] = [.506, .307, .186]:
  // ascending mass .186 <= 0.4 drops token 2, .186 + .307 > 0.4 keeps token 1.
  EXPECT_EQ(got, (std::vector<float>{2.0f, 1.5f, kNegInf, kNegInf}));
}

TEST(Sampler, SameSeedSameDrawsAndDrawsStayInsideTheFilter) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> logits(50);
  for (float& v : logits) v = normal(rng);
  const GenerationSettings s = sampling(1.5, 1.0, 5);
  std::vector<int32_t> by_score(logits.size());
  std::iota(by_score.begin(), by_score.end(), 0);
  std::sort(by_score.begin(), by_score.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const std::set<int32_t> top5(by_score.begin(), by_score.begin() + 5);
  Sampler a(s, 42), b(s, 42), c(s, 43);
  std::vector<int32_t> da, db, dc;
  for (int i = 0; i < 64; ++i) {
    da.push_back(a.next(logits, {}));
    db.push_back(b.next(logits, {}));
    dc.push_back(c.next(logits, {}));
    EXPECT_TRUE(top5.count(da.back())) << da.back();
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
  EXPECT_GT(std::set<int32_t>(da.begin(), da.end()).size(), 1u);  // it does sample
}

TEST(Sampler, DrawFrequenciesFollowTheTemperedDistribution) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4 at temperature 1
  Sampler sampler(sampling(1.0, 1.0, 0), 7);
  int ones = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) ones += sampler.next(logits, {});
  EXPECT_NEAR(ones / static_cast<double>(n), 0.75, 0.03);
}

TEST(Sampler, BadSettingsAreErrors) {
  EXPECT_THROW(validateSettings(sampling(0.0, 0.7, 50)), Error);
  EXPECT_THROW(validateSettings(sampling(1.0, 0.0, 50)), Error);
  EXPECT_THROW(validateSettings(sampling(1.0, 1.5, 50)), Error);
  EXPECT_THROW(validateSettings(sampling(1.0, 0.7, -1)), Error);
  GenerationSettings s;
  s.max_new_tokens = 0;
  EXPECT_THROW(validateSettings(s), Error);
  s = GenerationSettings{};
  s.repetition_penalty = 0;
  EXPECT_THROW(validateSettings(s), Error);
  s = GenerationSettings{};
  s.do_sample = false;
  s.temperature = 0;  // ignored by greedy decoding
  EXPECT_NO_THROW(validateSettings(s));
}

}  // namespace
}  // namespace tandem::infer
