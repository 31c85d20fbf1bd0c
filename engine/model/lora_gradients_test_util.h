#pragma once
// What the model tests compare between two runs: every LoRA gradient by name, the torch-side
// linears' and the expert LoRA's, as plain floats.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/model/causal_lm.h"

namespace tandem::model::testing {

inline std::vector<float> tensorValues(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU, at::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

// "<module>.A" / ".B" for every LoRA linear, "<mlp>.experts.<proj>.A" / ".B" for every MoE
// block's expert LoRA (all experts of the projection), after a backward.
inline std::map<std::string, std::vector<float>> loraGradients(CausalLm& model) {
  std::map<std::string, std::vector<float>> grads;
  model.visitLinears([&](const std::string& name, gpu::LoraLinear& l) {
    if (!l.hasLora()) return;
    grads[name + ".A"] = tensorValues(l.loraA().grad());
    grads[name + ".B"] = tensorValues(l.loraB().grad());
  });
  model.visitMoeBlocks([&](const std::string& name, MoeBlock& block) {
    for (auto proj :
         {experts::ExpertProj::Gate, experts::ExpertProj::Up, experts::ExpertProj::Down}) {
      const std::string p = name + ".experts." + std::to_string(static_cast<int>(proj));
      const auto a = block.experts->lora().allGradA(proj), b = block.experts->lora().allGradB(proj);
      grads[p + ".A"] = {a.begin(), a.end()};
      grads[p + ".B"] = {b.begin(), b.end()};
    }
  });
  return grads;
}

// The worst relative difference between two runs: the losses', and per gradient the largest
// absolute difference over the largest magnitude of `want`'s.
inline float worstRelativeError(float got_loss,
                                const std::map<std::string, std::vector<float>>& got,
                                float want_loss,
                                const std::map<std::string, std::vector<float>>& want) {
  EXPECT_EQ(got.size(), want.size());
  float worst = std::abs(got_loss - want_loss) / std::abs(want_loss);
  for (const auto& [name, w] : want) {
    const std::vector<float>& g = got.at(name);
    EXPECT_EQ(g.size(), w.size()) << name;
    float scale = 1e-30f, diff = 0;
    for (size_t i = 0; i < w.size() && i < g.size(); ++i) {
      scale = std::max(scale, std::abs(w[i]));
      diff = std::max(diff, std::abs(g[i] - w[i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace tandem::model::testing
