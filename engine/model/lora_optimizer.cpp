#include "engine/model/lora_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/model/causal_lm.h"

namespace tandem::model {

namespace {
constexpr int64_t kChunk = 1 << 14;  // elements per task: large enough to amortise scheduling

}  // namespace

void fusedAdamWStep(std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                    std::span<float> exp_avg_sq, double lr, const AdamWSettings& s, int64_t step,
                    ThreadPool& pool) {
  const float b1 = static_cast<float>(s.beta1), b2 = static_cast<float>(s.beta2);
  const float bias1 = static_cast<float>(1.0 - std::pow(s.beta1, static_cast<double>(step)));
  const float bias2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(s.beta2, static_cast<double>(step))));
  const float step_size = static_cast<float>(lr) / bias1;
  const float decay = static_cast<float>(1.0 - lr * s.weight_decay);
  const float eps = static_cast<float>(s.eps);
  pool.parallelFor(0, static_cast<int64_t>(param.size()), kChunk, [&](int64_t begin, int64_t end) {
    // One pass per element: read p, g, m, v once, write p, m, v once (torch's _fused_adamw math).
    for (int64_t i = begin; i < end; ++i) {
      const float g = grad[i];
      const float m = b1 * exp_avg[i] + (1.0f - b1) * g;
      const float v = b2 * exp_avg_sq[i] + (1.0f - b2) * g * g;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      const float denom = std::sqrt(v) / bias2_sqrt + eps;
      param[i] = param[i] * decay - step_size * m / denom;
    }
  });
}

LoraOptimizer::LoraOptimizer(model::CausalLm& model, const AdamWSettings& settings,
                             ThreadPool& pool)
    : settings_(settings), pool_(pool) {
  model.visitLinears([&](const std::string& name, gpu::LoraLinear& linear) {
    if (!linear.hasLora()) return;
    for (auto [suffix, tensor] :
         {std::pair{".lora_A", linear.loraA()}, std::pair{".lora_B", linear.loraB()}}) {
      torch_params_.push_back(
          {name + suffix, tensor, at::zeros_like(tensor), at::zeros_like(tensor)});
    }
  });
  // LoRA experts step, clip and checkpoint with the torch-side adapters of their device.
  model.visitMoeBlocks([&](const std::string& mlp, model::MoeBlock& block) {
    block.lora_experts.visitWeights(mlp, [&](const std::string& name, at::Tensor& w) {
      torch_params_.push_back({name, w, at::zeros_like(w), at::zeros_like(w)});
    });
  });
  model.visitMoeBlocks([&](const std::string& mlp, model::MoeBlock& block) {
    experts::ExpertLora& lora = block.experts->lora();
    for (int p = 0; p < experts::kExpertProjCount; ++p) {
      const auto proj = static_cast<experts::ExpertProj>(p);
      if (!lora.targets(proj)) continue;
      const std::string base = mlp + ".experts." + std::string(experts::expertProjName(proj));
      for (bool is_a : {true, false}) {
        CpuParam cp;
        cp.name = base + (is_a ? ".lora_A" : ".lora_B");
        cp.param = is_a ? lora.allA(proj) : lora.allB(proj);
        cp.grad = is_a ? lora.allGradA(proj) : lora.allGradB(proj);
        cp.exp_avg.assign(cp.param.size(), 0.0f);
        cp.exp_avg_sq.assign(cp.param.size(), 0.0f);
        cpu_params_.push_back(std::move(cp));
      }
    }
  });
  if (torch_params_.empty() && cpu_params_.empty()) {
    throw Error("the model has no LoRA weights to train",
                "check lora_target against the model's modules");
  }
  // The memory ledger: the expert engine charges its own LoRA buffers and the model its torch-side
  // adapters (CausalLmBuilder), so the optimizer adds what training brings: the torch-side
  // gradients (f32) and, on both sides, its two AdamW moments.
  for (const TorchParam& p : torch_params_) {
    const auto bytes = static_cast<uint64_t>(p.param.numel()) * sizeof(float);
    const std::string device = p.param.device().str();
    charges_.emplace_back(MemoryLedger::global(), device, MemoryCategory::Lora, bytes);
    charges_.emplace_back(MemoryLedger::global(), device, MemoryCategory::Optimizer, 2 * bytes);
  }
  for (const CpuParam& p : cpu_params_) {
    charges_.emplace_back(MemoryLedger::global(), "cpu", MemoryCategory::Optimizer,
                          2 * p.param.size() * sizeof(float));
  }
}

int64_t LoraOptimizer::numParameters() const {
  int64_t n = 0;
  for (const TorchParam& p : torch_params_) n += p.param.numel();
  for (const CpuParam& p : cpu_params_) n += static_cast<int64_t>(p.param.size());
  return n;
}

std::map<std::string, LoraOptimizer::DeviceGroup> LoraOptimizer::groupsWithGrads() {
  std::map<std::string, DeviceGroup> groups;
  for (TorchParam& p : torch_params_) {
    if (!p.param.grad().defined()) p.param.mutable_grad() = at::zeros_like(p.param);
    DeviceGroup& g = groups[p.param.device().str()];
    g.params.push_back(p.param);
    g.grads.push_back(p.param.grad());
    g.exp_avgs.push_back(p.exp_avg);
    g.exp_avg_sqs.push_back(p.exp_avg_sq);
  }
  return groups;
}

double LoraOptimizer::clipGradNorm(double max_norm) {
  at::NoGradGuard no_grad;
  // One reduction and one wait per device, not one per adapter: each .item() waits for the
  // device, and a model has hundreds of adapters.
  const std::map<std::string, DeviceGroup> groups = groupsWithGrads();
  double sum_sq = 0;
  for (const auto& [device, g] : groups) {
    sum_sq += at::stack(at::_foreach_norm(g.grads, 2)).to(at::kDouble).pow(2).sum().item<double>();
  }
  for (const CpuParam& p : cpu_params_) {
    double s = 0;
    for (float g : p.grad) s += static_cast<double>(g) * g;
    sum_sq += s;
  }
  const double norm = std::sqrt(sum_sq);
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  const double coef = max_norm / (norm + 1e-6);
  if (max_norm > 0 && coef < 1.0) {
    for (const auto& [device, g] : groups) at::_foreach_mul_(g.grads, coef);
    for (CpuParam& p : cpu_params_) {
      for (float& g : p.grad) g = static_cast<float>(g * coef);
    }
  }
  return norm;
}

void LoraOptimizer::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_;
  const double bias1 = 1.0 - std::pow(settings_.beta1, static_cast<double>(step_));
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(settings_.beta2, static_cast<double>(step_)));
  // The update of torch::optim::AdamW, op for op, as _foreach ops: a few kernels per device
  // instead of six per adapter.
  for (const auto& [device, g] : groupsWithGrads()) {
    at::_foreach_mul_(g.exp_avgs, settings_.beta1);
    at::_foreach_add_(g.exp_avgs, g.grads, 1.0 - settings_.beta1);
    at::_foreach_mul_(g.exp_avg_sqs, settings_.beta2);
    at::_foreach_addcmul_(g.exp_avg_sqs, g.grads, g.grads, 1.0 - settings_.beta2);
    std::vector<at::Tensor> denom = at::_foreach_sqrt(g.exp_avg_sqs);
    at::_foreach_div_(denom, bias2_sqrt);
    at::_foreach_add_(denom, settings_.eps);
    at::_foreach_mul_(g.params, 1.0 - lr * settings_.weight_decay);
    at::_foreach_addcdiv_(g.params, g.exp_avgs, denom, -lr / bias1);
  }
  for (CpuParam& p : cpu_params_) {
    fusedAdamWStep(p.param, p.grad, p.exp_avg, p.exp_avg_sq, lr, settings_, step_, pool_);
  }
}

std::vector<at::Tensor> LoraOptimizer::gradientTensors() {
  std::vector<at::Tensor> grads;
  for (auto& [device, g] : groupsWithGrads())
    grads.insert(grads.end(), g.grads.begin(), g.grads.end());
  for (CpuParam& p : cpu_params_) {
    grads.push_back(
        at::from_blob(p.grad.data(), {static_cast<int64_t>(p.grad.size())}, at::kFloat));
  }
  return grads;
}

void LoraOptimizer::zeroGrad() {
  for (const auto& [device, g] : groupsWithGrads()) at::_foreach_zero_(g.grads);
  for (CpuParam& p : cpu_params_) std::fill(p.grad.begin(), p.grad.end(), 0.0f);
}

std::map<std::string, at::Tensor> LoraOptimizer::stateDict() const {
  std::map<std::string, at::Tensor> out;
  for (const TorchParam& p : torch_params_) {
    out[p.name + ".exp_avg"] = p.exp_avg.to(at::kCPU).contiguous();
    out[p.name + ".exp_avg_sq"] = p.exp_avg_sq.to(at::kCPU).contiguous();
  }
  for (const CpuParam& p : cpu_params_) {
    const int64_t n = static_cast<int64_t>(p.param.size());
    out[p.name + ".exp_avg"] =
        at::from_blob(const_cast<float*>(p.exp_avg.data()), {n}, at::kFloat).clone();
    out[p.name + ".exp_avg_sq"] =
        at::from_blob(const_cast<float*>(p.exp_avg_sq.data()), {n}, at::kFloat).clone();
  }
  return out;
}

void LoraOptimizer::loadStateDict(const std::map<std::string, at::Tensor>& state, int64_t step) {
  auto get = [&](const std::string& key, int64_t numel) {
    auto it = state.find(key);
    if (it == state.end() || it->second.numel() != numel) {
      throw Error(
          "optimizer state " + key + " is missing or has the wrong size in the checkpoint",
          "the checkpoint belongs to another configuration; start over with overwrite_output_dir");
    }
    return it->second;
  };
  at::NoGradGuard no_grad;
  for (TorchParam& p : torch_params_) {
    p.exp_avg.copy_(get(p.name + ".exp_avg", p.param.numel()).view(p.param.sizes()));
    p.exp_avg_sq.copy_(get(p.name + ".exp_avg_sq", p.param.numel()).view(p.param.sizes()));
  }
  for (CpuParam& p : cpu_params_) {
    const int64_t n = static_cast<int64_t>(p.param.size());
    const at::Tensor m = get(p.name + ".exp_avg", n).contiguous();
    const at::Tensor v = get(p.name + ".exp_avg_sq", n).contiguous();
    std::copy_n(m.data_ptr<float>(), n, p.exp_avg.data());
    std::copy_n(v.data_ptr<float>(), n, p.exp_avg_sq.data());
  }
  step_ = step;
}

}  // namespace tandem::model
