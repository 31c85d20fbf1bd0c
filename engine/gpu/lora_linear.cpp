#include "engine/gpu/lora_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <vector>

#include "engine/core/error.h"

namespace tandem::gpu {

double LoraSettings::scale() const {
  if (rank <= 0) return 0;
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / rank;
}

LoraLinear::LoraLinear(at::Tensor weight, at::Tensor bias)
    : weight_(std::move(weight)), bias_(std::move(bias)) {}

int64_t LoraLinear::inFeatures() const { return weight_.size(1); }
int64_t LoraLinear::outFeatures() const { return weight_.size(0); }

void LoraLinear::attachLora(const LoraSettings& settings, at::Tensor a, at::Tensor b) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(0) != settings.rank || b.size(1) != settings.rank ||
      a.size(1) != inFeatures() || b.size(0) != outFeatures()) {
    throw Error("LoRA shapes do not fit the layer: A must be [" + std::to_string(settings.rank) +
                    ", " + std::to_string(inFeatures()) + "] and B [" +
                    std::to_string(outFeatures()) + ", " + std::to_string(settings.rank) + "]",
                "check the adapter's rank (r) against its weights");
  }
  const auto options = at::TensorOptions().dtype(at::kFloat).device(weight_.device());
  if (hasLora() && lora_a_.sizes() == a.sizes() && lora_b_.sizes() == b.sizes()) {
    // Already attached: load the values in place, so whoever holds these leaves (an optimizer
    // restoring a checkpoint) keeps updating the tensors the model uses.
    at::NoGradGuard no_grad;
    lora_a_.copy_(a.to(options));
    lora_b_.copy_(b.to(options));
  } else {
    lora_a_ = a.to(options).contiguous().detach().requires_grad_(true);
    lora_b_ = b.to(options).contiguous().detach().requires_grad_(true);
  }
  scale_ = settings.scale();
  dropout_ = settings.dropout;
}

void LoraLinear::attachFreshLora(const LoraSettings& settings, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  const double bound = 1.0 / std::sqrt(static_cast<double>(inFeatures()));
  at::Tensor a = at::empty({settings.rank, inFeatures()}, at::kFloat);
  a.uniform_(-bound, bound, generator);
  attachLora(settings, a, at::zeros({outFeatures(), settings.rank}, at::kFloat));
}

at::Tensor fewRowLinear(const FewRowLinear& kernel, const at::Tensor& x, int64_t in_features,
                        int64_t out_features) {
  // fp32 activations keep at::linear: the kernels' int8 activations are bf16-class, not fp32-exact
  // (as the expert engine's auto keeps fp32 kernels for them).
  if (at::GradMode::is_enabled() || !x.device().is_cpu() || x.scalar_type() == at::kFloat ||
      x.dim() == 0 || x.size(-1) != in_features) {
    return {};
  }
  const int64_t rows = x.numel() / in_features;
  if (rows == 0 || rows > kernel.maxRows()) return {};
  const at::Tensor x32 = x.to(at::kFloat).contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out_features;
  at::Tensor y = at::empty(shape, x32.options());
  kernel.forward(x32.const_data_ptr<float>(), rows, y.mutable_data_ptr<float>());
  return y;
}

// x Wᵀ (+ b) by the few-row kernel in x's dtype, or undefined when it does not apply to this call.
at::Tensor LoraLinear::fewRowForward(const at::Tensor& x, bool training) const {
  if (!few_row_ || training) return {};
  at::Tensor y = fewRowLinear(*few_row_, x, inFeatures(), outFeatures());
  if (!y.defined()) return y;
  if (bias_.defined()) y.add_(bias_);
  return y.to(x.scalar_type());
}

at::Tensor LoraLinear::forward(const at::Tensor& x, bool training) const {
  at::Tensor y = fewRowForward(x, training);
  if (!y.defined()) y = at::linear(x, weight_, bias_);
  if (!hasLora()) return y;
  at::Tensor x_lora = x.to(at::kFloat);
  if (training && dropout_ > 0) x_lora = at::dropout(x_lora, dropout_, /*train=*/true);
  const at::Tensor delta = at::linear(at::linear(x_lora, lora_a_), lora_b_) * scale_;
  return (y + delta).to(y.scalar_type());
}

}  // namespace tandem::gpu

namespace tandem::gpu {

at::Tensor LoraLinear::mergedWeight() const {
  if (!hasLora()) return weight_;
  return weight_ + (at::matmul(lora_b_, lora_a_) * scale_).to(weight_.scalar_type());
}

}  // namespace tandem::gpu

namespace tandem::gpu {

void LoraLinear::clearLora() {
  lora_a_ = at::Tensor();
  lora_b_ = at::Tensor();
  scale_ = 0;
  dropout_ = 0;
}

void LoraLinear::mergeLora() {
  if (!hasLora()) return;
  at::NoGradGuard no_grad;
  weight_ = mergedWeight().detach();
  few_row_.reset();  // it computes the unmerged W
  clearLora();
}

}  // namespace tandem::gpu
