#include "engine/gpu/expert_offload.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <array>
#include <memory>
#include <vector>

#include "engine/gpu/weight_loader.h"

namespace tandem::gpu {

namespace {

using experts::ExpertLora;
using experts::ExpertProj;
using experts::kExpertProjCount;

// The LoRA matrices on the device: a [E, r, in], b [E, out, r] fp32 per targeted projection.
struct DeviceLora {
  std::array<at::Tensor, kExpertProjCount> a, b;
  float scale = 0;
};

at::Tensor hostView(std::span<float> buffer, int64_t experts, int64_t rows, int64_t cols) {
  return at::from_blob(buffer.data(), {experts, rows, cols}, at::kFloat);
}

// Copies A and B to `device` (on the CPU device: views of the buffers); leaves that require grad
// when `trainable`.
DeviceLora streamLora(ExpertLora& lora, at::Device device, bool trainable) {
  DeviceLora out;
  out.scale = lora.scale();
  for (int p = 0; p < kExpertProjCount; ++p) {
    const auto proj = static_cast<ExpertProj>(p);
    if (!lora.targets(proj)) continue;
    const int64_t e = lora.numExperts(), r = lora.rank();
    out.a[p] = hostView(lora.allA(proj), e, r, lora.inFeatures(proj)).to(device);
    out.b[p] = hostView(lora.allB(proj), e, lora.outFeatures(proj), r).to(device);
    if (trainable) {
      out.a[p] = out.a[p].detach().requires_grad_(true);
      out.b[p] = out.b[p].detach().requires_grad_(true);
    }
  }
  return out;
}

// in [n, in] model dtype -> [n, out]: x Wᵀ + s · (x Aᵀ) Bᵀ, the LoRA branch in fp32.
at::Tensor project(const at::Tensor& in, const at::Tensor& weight, const DeviceLora& lora,
                   ExpertProj proj, int64_t expert) {
  const at::Tensor y = at::linear(in, weight);
  const int p = static_cast<int>(proj);
  if (!lora.a[p].defined()) return y;
  const at::Tensor delta =
      at::linear(at::linear(in.to(at::kFloat), lora.a[p][expert]), lora.b[p][expert]) * lora.scale;
  return (y + delta).to(y.scalar_type());
}

// x [T, H], ids [T, k] int64, weights [T, k] fp32 -> [T, H] in x's dtype; differentiable in x,
// weights and the LoRA leaves.
at::Tensor expertsForward(const ExpertOffload::DeviceWeights& w, const DeviceLora& lora,
                          const at::Tensor& x, const at::Tensor& ids, const at::Tensor& weights) {
  const int64_t n_experts = w.gate.size(0), top_k = ids.size(1);
  // Pairs (token, slot) grouped by expert: a stable sort keeps each expert's tokens in order.
  const at::Tensor flat_ids = ids.reshape({-1});
  const at::Tensor order = at::argsort(flat_ids, /*stable=*/true);
  const at::Tensor pair_token = at::div(order, top_k, "floor");
  const at::Tensor counts = at::bincount(flat_ids, {}, n_experts).to(at::kCPU);
  const at::Tensor rows = x.index_select(0, pair_token);  // [P, H]
  std::vector<at::Tensor> outs;
  int64_t offset = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t n = counts[e].item<int64_t>();
    if (n == 0) continue;
    const at::Tensor in = rows.narrow(0, offset, n);
    const at::Tensor h = at::silu(project(in, w.gate[e], lora, ExpertProj::Gate, e)) *
                         project(in, w.up[e], lora, ExpertProj::Up, e);
    outs.push_back(project(h, w.down[e], lora, ExpertProj::Down, e));
    offset += n;
  }
  const at::Tensor pair_weight = weights.reshape({-1}).index_select(0, order).unsqueeze(1);
  const at::Tensor weighted = at::cat(outs).to(at::kFloat) * pair_weight;  // [P, H] fp32
  return at::zeros({x.size(0), x.size(1)}, weighted.options()).index_add(0, pair_token, weighted)
      .to(x.scalar_type());
}

class OffloadedExpertsBackward : public torch::autograd::Node {
 public:
  OffloadedExpertsBackward(const ExpertOffload& offload, ExpertLora& lora, at::Tensor hidden,
                           at::Tensor ids, at::Tensor weights)
      : offload_(offload), lora_(lora), hidden_(std::move(hidden)), ids_(std::move(ids)),
        weights_(std::move(weights)) {}

  std::string name() const override { return "tandem::OffloadedExpertsBackward"; }

  // Streams the weights again and differentiates a recomputed forward (reentrant autograd):
  // nothing of the forward's device-side intermediates was kept.
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::AutoGradMode grad_mode(true);
    const at::Tensor x = hidden_.detach().requires_grad_(true);
    const at::Tensor w = weights_.detach().requires_grad_(true);
    const DeviceLora lora = streamLora(lora_, offload_.device(), /*trainable=*/true);
    const at::Tensor y = expertsForward(offload_.stream(), lora, x, ids_, w);
    std::vector<at::Tensor> inputs{x, w};
    for (int p = 0; p < kExpertProjCount; ++p) {
      if (lora.a[p].defined()) inputs.insert(inputs.end(), {lora.a[p], lora.b[p]});
    }
    at::Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(y);
    const auto d = torch::autograd::grad({y}, inputs, {dy}, /*retain_graph=*/false,
                                         /*create_graph=*/false, /*allow_unused=*/true);
    size_t next = 2;
    for (int p = 0; p < kExpertProjCount; ++p) {
      if (!lora.a[p].defined()) continue;
      const auto proj = static_cast<ExpertProj>(p);
      const int64_t e = lora_.numExperts(), r = lora_.rank();
      accumulate(hostView(lora_.allGradA(proj), e, r, lora_.inFeatures(proj)), d[next++]);
      accumulate(hostView(lora_.allGradB(proj), e, lora_.outFeatures(proj), r), d[next++]);
    }
    release_variables();
    torch::autograd::variable_list result(3);
    if (should_compute_output(0)) result[0] = d[0];
    if (should_compute_output(1)) result[1] = d[1];
    return result;  // the anchor gets no gradient: the LoRA grads live in the host buffers
  }

  void release_variables() override {
    hidden_.reset();
    ids_.reset();
    weights_.reset();
  }

 private:
  static void accumulate(at::Tensor host_grad, const at::Tensor& grad) {
    if (grad.defined()) host_grad.add_(grad.to(at::kCPU));
  }

  const ExpertOffload& offload_;
  ExpertLora& lora_;
  at::Tensor hidden_, ids_, weights_;
};

}  // namespace

ExpertOffload::ExpertOffload(const experts::ExpertLayerSpec& spec,
                             const experts::ExpertWeightViews& weights, at::ScalarType dtype,
                             at::Device device)
    : device_(device) {
  const auto options = at::TensorOptions().dtype(dtype).pinned_memory(device.is_cuda());
  const bool fp8 = weights.type == experts::WeightType::FP8_E4M3;
  // fp8 checkpoints: dequantised here with their block scales (the GPU computes in `dtype`).
  auto stack = [&](const std::vector<const void*>& views, const std::vector<const float*>& scales,
                   int64_t rows, int64_t cols) {
    at::Tensor host = at::empty({spec.num_experts, rows, cols}, options);
    for (int64_t e = 0; e < spec.num_experts; ++e) {
      const auto i = static_cast<size_t>(e);
      const at::Tensor stored = at::from_blob(const_cast<void*>(views[i]), {rows, cols},
                                              at::TensorOptions().dtype(fp8 ? at::kFloat8_e4m3fn : dtype));
      if (!fp8) {
        host[e].copy_(stored);
        continue;
      }
      const int64_t block = experts::kFp8BlockSize;
      const at::Tensor scale = at::from_blob(const_cast<float*>(scales[i]),
                                             {(rows + block - 1) / block, (cols + block - 1) / block}, at::kFloat);
      host[e].copy_(dequantizeFp8Blocks(stored, scale, dtype));
    }
    return host;
  };
  gate_ = stack(weights.gate, weights.gate_scale, spec.intermediate, spec.hidden);
  up_ = stack(weights.up, weights.up_scale, spec.intermediate, spec.hidden);
  down_ = stack(weights.down, weights.down_scale, spec.hidden, spec.intermediate);
  charge_ = MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Weights,
                         gate_.nbytes() + up_.nbytes() + down_.nbytes());
}

ExpertOffload::DeviceWeights ExpertOffload::stream() const {
  const bool async = device_.is_cuda();
  return {gate_.to(device_, /*non_blocking=*/async), up_.to(device_, /*non_blocking=*/async),
          down_.to(device_, /*non_blocking=*/async)};
}

at::Tensor ExpertOffload::forward(ExpertLora& lora, const at::Tensor& hidden,
                                  const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                                  const at::Tensor& lora_anchor) const {
  const at::Tensor ids = topk_ids.to(device_, at::kLong);
  const at::Tensor weights = topk_weights.to(device_, at::kFloat);
  at::Tensor y;
  {
    at::NoGradGuard no_grad;
    y = expertsForward(stream(), streamLora(lora, device_, /*trainable=*/false), hidden.detach(),
                       ids, weights.detach());
  }
  if (!torch::autograd::compute_requires_grad(hidden, topk_weights, lora_anchor)) return y;
  std::shared_ptr<OffloadedExpertsBackward> node(
      new OffloadedExpertsBackward(*this, lora, hidden.detach(), ids, weights.detach()),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(hidden, topk_weights, lora_anchor));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace tandem::gpu
