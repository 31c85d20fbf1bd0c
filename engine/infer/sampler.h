#pragma once
// Picking the next token from a row of logits, as transformers' generate() does with
// LLaMA-Factory's settings: RepetitionPenaltyLogitsProcessor, then (when sampling) the
// Temperature, TopK and TopP warpers in that order, then a draw from the softmax; greedy is the
// argmax of the penalised logits. Plain C++ on the host copy of the logits (a vocabulary's
// floats a token, against a whole forward pass).

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/infer/generator.h"

namespace tandem::infer {

// Throws tandem::Error naming the bad field (temperature <= 0, top_p outside (0, 1], ...).
void validateSettings(const GenerationSettings& settings);

// logits [vocab] -> the scores the draw uses, in place: filtered entries become -inf. `seen`:
// the prompt and the tokens generated so far (repetition penalty).
void processLogits(std::vector<float>& scores, const GenerationSettings& settings,
                   std::span<const int32_t> seen);

class Sampler {
 public:
  // The same seed gives the same draws (mt19937_64, whose output the C++ standard fixes).
  Sampler(const GenerationSettings& settings, uint64_t seed);
  // logits [vocab] fp32.
  int32_t next(std::vector<float> logits, std::span<const int32_t> seen);

 private:
  GenerationSettings settings_;
  std::mt19937_64 rng_;
};

}  // namespace tandem::infer
