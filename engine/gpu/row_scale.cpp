#include "engine/gpu/row_scale.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <memory>
#include <string>
#include <utility>

#ifdef TANDEM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/gpu/int8_kernel_check.h"
#include "engine/gpu/int8_kernels_cuda.h"
#endif

namespace tandem::gpu {

namespace {

// The product, without a graph: our kernel on a CUDA device, torch's ops elsewhere (the reference).
at::Tensor scaled(const at::Tensor& y, const at::Tensor& scale, const at::Tensor& row_expert,
                  at::ScalarType out_dtype) {
#ifdef TANDEM_WITH_CUDA
  const auto kernel_dtype = [](at::ScalarType t) { return t == at::kBFloat16 || t == at::kFloat; };
  if (y.is_cuda() && y.dim() == 2 && kernel_dtype(y.scalar_type()) && kernel_dtype(out_dtype) &&
      scale.scalar_type() == at::kFloat && row_expert.scalar_type() == at::kLong) {
    const c10::cuda::CUDAGuard guard(y.device());
    const at::Tensor in = y.contiguous(), s = scale.contiguous(), e = row_expert.contiguous();
    at::Tensor out = at::empty(in.sizes(), in.options().dtype(out_dtype));
    const cudaError_t status = launchScaleRowsByExpert(
        in.data_ptr(), in.scalar_type() == at::kBFloat16, s.data_ptr<float>(),
        e.data_ptr<int64_t>(), out.data_ptr(), out_dtype == at::kBFloat16, in.size(0), in.size(1),
        c10::cuda::getCurrentCUDAStream(y.device().index()));
    throwIfLaunchFailed(status, "scaling int8 experts' outputs", y.device().str());
    return out;
  }
#endif
  return (y.to(at::kFloat) * scale.index_select(0, row_expert)).to(out_dtype);
}

class ScaleRowsBackward : public torch::autograd::Node {
 public:
  ScaleRowsBackward(at::Tensor scale, at::Tensor row_expert, at::ScalarType y_dtype)
      : scale_(std::move(scale)), row_expert_(std::move(row_expert)), y_dtype_(y_dtype) {}

  std::string name() const override { return "tandem::ScaleRowsBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor dy;
    if (grads[0].defined()) dy = scaled(grads[0], scale_, row_expert_, y_dtype_);
    release_variables();
    return {dy};
  }

  void release_variables() override {
    scale_.reset();
    row_expert_.reset();
  }

 private:
  at::Tensor scale_, row_expert_;
  at::ScalarType y_dtype_;
};

}  // namespace

at::Tensor scaleRowsByExpert(const at::Tensor& y, const at::Tensor& scale,
                             const at::Tensor& row_expert, at::ScalarType out_dtype) {
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = scaled(y.detach(), scale, row_expert, out_dtype);
  }
  if (!torch::autograd::compute_requires_grad(y)) return out;
  std::shared_ptr<ScaleRowsBackward> node(
      new ScaleRowsBackward(scale.detach(), row_expert, y.scalar_type()),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(y));
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace tandem::gpu
