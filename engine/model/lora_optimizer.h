#pragma once
// AdamW over every LoRA weight of a CausalLm, with one global grad-norm clip:
//   torch-side adapters (attention, MLPs, shared experts, routers) are at::Tensor leaves on their
//   layer's device and step with ATen ops there (their state stays with them);
//   routed-expert adapters live in the expert engine's contiguous fp32 buffers and step with one
//   fused single-pass CPU kernel on the thread pool.
// Same update as torch.optim.AdamW (decoupled weight decay, bias correction).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/model/lora_training.h"

namespace tandem {
class ThreadPool;
}
namespace tandem::model {

class CausalLm;

// One fused AdamW step on CPU buffers of equal length: param, grad, exp_avg, exp_avg_sq.
// step is 1-based (after increment). Bias corrections as torch: 1 - beta^step.
void fusedAdamWStep(std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                    std::span<float> exp_avg_sq, double lr, const AdamWSettings& s, int64_t step,
                    ThreadPool& pool);

class LoraOptimizer {
 public:
  LoraOptimizer(model::CausalLm& model, const AdamWSettings& settings, ThreadPool& pool);

  // Global L2 norm of all LoRA gradients; scales them down to max_norm when above (and > 0).
  double clipGradNorm(double max_norm);
  void step(double lr);
  void zeroGrad();
  // Every LoRA gradient as a tensor over its storage (torch-side grads, zero-filled where
  // undefined; the expert engine's contiguous fp32 buffers wrapped, not copied): for the
  // all-reduce of a data-parallel step.
  std::vector<at::Tensor> gradientTensors();
  int64_t stepCount() const { return step_; }
  int64_t numParameters() const;

  // Optimizer state by parameter name ("<name>.exp_avg" / ".exp_avg_sq"), fp32 CPU tensors.
  std::map<std::string, at::Tensor> stateDict() const;
  void loadStateDict(const std::map<std::string, at::Tensor>& state, int64_t step);

 private:
  struct TorchParam {
    std::string name;
    at::Tensor param;  // leaf, fp32, requires grad
    at::Tensor exp_avg, exp_avg_sq;
  };
  struct CpuParam {
    std::string name;
    std::span<float> param, grad;
    std::vector<float> exp_avg, exp_avg_sq;
  };
  // The torch-side adapters of one device, for the _foreach ops (one list per operand).
  struct DeviceGroup {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  };
  // By device; an adapter without a gradient gets a zero one (it still decays and moves with its
  // moments, as torch's AdamW does for a parameter whose grad is zero).
  std::map<std::string, DeviceGroup> groupsWithGrads();

  AdamWSettings settings_;
  ThreadPool& pool_;
  std::vector<TorchParam> torch_params_;
  std::vector<CpuParam> cpu_params_;
  std::vector<MemoryCharge>
      charges_;  // MemoryLedger: adapters' moments (and torch-side weights + grads)
  int64_t step_ = 0;
};

}  // namespace tandem::model
