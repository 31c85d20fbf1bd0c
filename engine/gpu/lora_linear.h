#pragma once
// A frozen linear layer with an optional LoRA adapter, with PEFT's semantics:
//   y = x Wᵀ + b + scale · (dropout(x) Aᵀ) Bᵀ
// W [out, in] and b in the model dtype (frozen); A [r, in] and B [out, r] are fp32 master
// weights (autograd leaves). As PEFT does, the LoRA branch runs in fp32 and the sum is cast
// back to the model dtype.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "engine/gpu/lora_settings.h"

namespace tandem::gpu {

// A frozen weight's inference-only second form: a CPU kernel that computes x Wᵀ for a few rows
// straight from the weight as its file stores it (engine/model/stored_block_linear.h: a GGUF's
// blocks, the way llama.cpp decodes), so a decode step reads those bytes instead of the dequantised
// copy's. Must hold the same W as the layer's weight tensor.
class FewRowLinear {
 public:
  virtual ~FewRowLinear() = default;
  virtual int64_t maxRows() const = 0;
  // y [rows, out] fp32 = x [rows, in] fp32 (contiguous) · Wᵀ; rows ≤ maxRows().
  virtual void forward(const float* x, int64_t rows, float* y) const = 0;
};

// x [..., in] · Wᵀ by `kernel` as fp32 [..., out], or an undefined tensor when the call is not one
// it takes (grad mode on, x not on the CPU, fp32 or in another shape, more rows than maxRows).
at::Tensor fewRowLinear(const FewRowLinear& kernel, const at::Tensor& x, int64_t in_features,
                        int64_t out_features);

class LoraLinear {
 public:
  LoraLinear() = default;
  // weight [out, in], bias [out] or undefined; both already on their device and dtype.
  LoraLinear(at::Tensor weight, at::Tensor bias);

  // Adds an adapter. a [r, in] and b [out, r] fp32 on the weight's device; they become leaves
  // that require grad. On a layer that has one of the same shape, copies the values in place.
  void attachLora(const LoraSettings& settings, at::Tensor a, at::Tensor b);
  // PEFT's init: A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0.
  void attachFreshLora(const LoraSettings& settings, uint64_t seed);

  // x [..., in] model dtype -> [..., out] model dtype.
  at::Tensor forward(const at::Tensor& x, bool training) const;
  // W + scale · B A in W's dtype, the delta computed in fp32: how PEFT applies LoRA to a bare
  // weight parameter (target_parameters), e.g. an MoE router. Differentiable in A and B.
  at::Tensor mergedWeight() const;
  // Inference (engine/infer): drop the adapter without touching the tensors it used, so an
  // adapter kept elsewhere can be attached again later; or fold it into a fresh weight
  // (W + scale · B A, PEFT's merge) and drop it.
  void clearLora();
  void mergeLora();

  // Inference without grad on the CPU, bf16/f16 activations, at most kernel->maxRows() rows goes
  // through `kernel` instead of at::linear (LoRA, when attached, still added in fp32); training,
  // grad mode, fp32 and other devices keep at::linear. mergeLora drops it (W changes).
  void setFewRowLinear(std::shared_ptr<const FewRowLinear> kernel) { few_row_ = std::move(kernel); }
  bool hasFewRowLinear() const { return few_row_ != nullptr; }
  // The kernel set above, or null (engine/model/decode_session_cpu.h calls it directly).
  const FewRowLinear* fewRowKernel() const { return few_row_.get(); }

  bool defined() const { return weight_.defined(); }
  bool hasLora() const { return lora_a_.defined(); }
  const at::Tensor& weight() const { return weight_; }
  const at::Tensor& bias() const { return bias_; }  // undefined when the layer has none
  at::Tensor& loraA() { return lora_a_; }
  at::Tensor& loraB() { return lora_b_; }
  int64_t inFeatures() const;
  int64_t outFeatures() const;

 private:
  at::Tensor fewRowForward(const at::Tensor& x, bool training) const;

  at::Tensor weight_;
  at::Tensor bias_;
  at::Tensor lora_a_;
  at::Tensor lora_b_;
  double scale_ = 0;
  double dropout_ = 0;
  std::shared_ptr<const FewRowLinear> few_row_;
};

}  // namespace tandem::gpu
