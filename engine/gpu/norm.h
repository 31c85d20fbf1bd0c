#pragma once
// RMSNorm as every target architecture defines it: normalise in fp32, cast back to the input
// dtype, then multiply by the weight (in the weight's dtype).

#include <ATen/core/Tensor.h>

namespace tandem::gpu {

// x [..., d], weight [d].
at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// While one is alive on a thread, rmsNorm there takes a fused row loop on the CPU when no gradient
// is recorded (inference: CausalLm::forwardCached). Outside it keeps the composite form, which a
// checkpointed layer's no-grad pass needs: its recomputation must see bitwise the same values.
class FusedRmsNormScope {
 public:
  FusedRmsNormScope();
  ~FusedRmsNormScope();
  FusedRmsNormScope(const FusedRmsNormScope&) = delete;
  FusedRmsNormScope& operator=(const FusedRmsNormScope&) = delete;

 private:
  bool previous_;
};

}  // namespace tandem::gpu
