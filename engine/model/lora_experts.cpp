#include "engine/model/lora_experts.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "engine/core/error.h"

namespace tandem::model {

LoraExperts LoraExperts::fresh(int64_t count, int64_t le_dim, int64_t hidden, at::Device device,
                               uint64_t seed) {
  if (count <= 0 || le_dim <= 0 || hidden <= 0) {
    throw Error("LoRA experts need a positive count, le_dim and hidden size (got " +
                std::to_string(count) + ", " + std::to_string(le_dim) + ", " +
                std::to_string(hidden) + ")");
  }
  // Drawn on the CPU from a generator of its own, so the values do not depend on the device or
  // on how many other adapters were initialised before.
  at::Generator generator = at::detail::createCPUGenerator(seed);
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  std::vector<LoraExpertPath> paths(static_cast<size_t>(count));
  for (LoraExpertPath& p : paths) {
    p.gate = at::empty({le_dim, hidden}, at::kFloat).uniform_(-bound, bound, generator);
    p.up = at::empty({le_dim, hidden}, at::kFloat).uniform_(-bound, bound, generator);
    p.down = at::zeros({hidden, le_dim}, at::kFloat);
  }
  return fromPaths(paths, device);
}

LoraExperts LoraExperts::fromPaths(const std::vector<LoraExpertPath>& paths, at::Device device) {
  LoraExperts le;
  for (const LoraExpertPath& p : paths) {
    LoraExpertPath leaf;
    for (int i = 0; i < 3; ++i) {
      leaf.proj(i) =
          p.proj(i).to(device, at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
      leaf.proj(i).requires_grad_(true);
    }
    le.paths_.push_back(std::move(leaf));
  }
  return le;
}

int64_t LoraExperts::dim() const { return paths_.empty() ? 0 : paths_.front().gate.size(0); }

at::Tensor LoraExperts::forward(const at::Tensor& tokens) const {
  const at::Tensor x = tokens.to(at::kFloat);
  at::Tensor sum;
  for (const LoraExpertPath& p : paths_) {
    const at::Tensor h = at::silu(at::linear(x, p.gate)) * at::linear(x, p.up);
    const at::Tensor out = at::linear(h, p.down);
    sum = sum.defined() ? sum + out : out;
  }
  return sum;
}

void LoraExperts::visitWeights(const std::string& mlp,
                               const std::function<void(const std::string&, at::Tensor&)>& visit) {
  for (size_t k = 0; k < paths_.size(); ++k) {
    for (int p = 0; p < 3; ++p) {
      visit(mlp + ".lora_experts." + std::to_string(k) + "." + kLoraExpertProjNames[p] + ".weight",
            paths_[k].proj(p));
    }
  }
}

}  // namespace tandem::model
