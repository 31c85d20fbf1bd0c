#pragma once
// Picking the next token from a row of logits, as transformers' generate() does with
// LLaMA-Factory's settings: RepetitionPenaltyLogitsProcessor, then (when sampling) the
// Temperature, TopK and TopP warpers in that order, then a multinomial draw from the softmax;
// greedy is the argmax of the penalised logits.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>

#include "engine/infer/generator.h"

namespace tandem::infer {

// Throws tandem::Error naming the bad field (temperature <= 0, top_p outside (0, 1], ...).
void validateSettings(const GenerationSettings& settings);

// logits [vocab] fp32 -> the scores the draw uses: filtered entries are -inf. `seen`: the
// prompt and the tokens generated so far (repetition penalty).
at::Tensor processLogits(const at::Tensor& logits, const GenerationSettings& settings,
                         std::span<const int32_t> seen);

class Sampler {
 public:
  Sampler(const GenerationSettings& settings, uint64_t seed);
  // logits [vocab] fp32 on any device.
  int32_t next(const at::Tensor& logits, std::span<const int32_t> seen);

 private:
  GenerationSettings settings_;
  at::Generator generator_;
};

}  // namespace tandem::infer
