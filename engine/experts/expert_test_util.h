#pragma once
// Test helpers for the expert engine: random problems, a dense fp64 reference written straight
// from the formulas in expert_layer.h, and a comparison that reports the first bad index.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/thread_pool.h"
#include "engine/experts/expert_layer.h"

namespace tandem::experts::testing {

enum class Routing { Random, Skewed, Sparse };  // Skewed: expert 0 in every token; Sparse: even ids

struct ProblemSpec {
  ExpertLayerSpec layer{6, 33, 19};
  ExpertLoraSpec lora{};
  WeightType weight_type = WeightType::F32;
  ActivationType act_type = ActivationType::F32;
  int64_t n_tokens = 13;
  int top_k = 2;
  Routing routing = Routing::Random;
  uint64_t seed = 1;
  Int4Spec int4;  // weight_type INT4: the tables' group and symmetry

  std::string describe() const;
};

struct LoraValues {         // one projection, all experts, fp32 as ExpertLora stores them
  std::vector<float> a, b;  // [E, r, in], [E, out, r]
};

struct Problem {
  ProblemSpec spec;
  // Weights: the exact values the layer sees (already rounded to weight_type), [E, out, in].
  std::vector<double> gate, up, down;
  std::vector<unsigned char> gate_bytes, up_bytes, down_bytes;  // misaligned, gapped storage
  std::vector<std::vector<float>> scales[kExpertProjCount];     // FP8 only: [E][blocks]
  ExpertWeightViews views;
  LoraValues lora[kExpertProjCount];
  std::vector<double> x, dy;                 // [T, H], representable in act_type
  std::vector<unsigned char> x_raw, dy_raw;  // the same in act_type
  std::vector<int32_t> ids;                  // [T, k]
  std::vector<float> weights;                // [T, k]
};

Problem makeProblem(const ProblemSpec& spec);

struct Grads {  // every output of one forward + backward, as doubles
  std::vector<double> y, dx, dw;
  std::vector<double> grad_a[kExpertProjCount], grad_b[kExpertProjCount];
};

Grads denseReference(const Problem& problem);

std::unique_ptr<ExpertLayer> makeLayer(const Problem& problem, std::string_view backend,
                                       ThreadPool& pool);
std::unique_ptr<ExpertLayer> makeLayer(const Problem& problem, const ExpertLayerOptions& options,
                                       ThreadPool& pool);
// One forward with a cache, then one backward, on a fresh layer (or the given one).
Grads runLayer(const Problem& problem, ExpertLayer& layer);
Grads collectLoraGrads(const Problem& problem, const ExpertLayer& layer, Grads grads);

std::vector<double> fromActivations(const std::vector<unsigned char>& raw, ActivationType type);
std::vector<unsigned char> toActivations(const std::vector<double>& values, ActivationType type);

struct Tolerance {
  double rel_l2;  // ‖got − want‖ / ‖want‖
  double elem;    // |got − want| ≤ elem · (|want| + rms(want)) for every element
};
// On failure names the quantity, the problem (dtypes, shape) and the first bad index.
::testing::AssertionResult closeTo(const std::string& what, const std::vector<double>& got,
                                   const std::vector<double>& want, Tolerance tol);
::testing::AssertionResult gradsClose(const Problem& problem, const Grads& got, const Grads& want,
                                      Tolerance tol);
// Every output bit for bit the same (gtest expectations, one per quantity).
void expectIdentical(const Grads& got, const Grads& want);

}  // namespace tandem::experts::testing
