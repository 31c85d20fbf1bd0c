#include "bench/experts/libtorch_expert_loop.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace tandem::bench {

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

at::Tensor bf16(const std::vector<uint16_t>& bits, at::IntArrayRef shape) {
  return at::from_blob(const_cast<uint16_t*>(bits.data()), shape, at::kBFloat16).clone();
}

// PEFT: x Wᵀ + s · (x Aᵀ) Bᵀ.
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& a,
                   const at::Tensor& b, double scale) {
  return at::matmul(x, w.t()) + at::matmul(at::matmul(x, a.t()), b.t()) * scale;
}

}  // namespace

BenchTiming timeLibtorchExpertLoop(const BenchProblem& p, int threads, int repeats) {
  at::set_num_threads(threads);
  const int64_t E = p.shape.num_experts, H = p.shape.hidden, I = p.shape.intermediate;
  const int64_t T = p.tokens, k = p.shape.top_k, r = p.lora_rank;
  const at::Tensor gate = bf16(p.gate, {E, I, H}), up = bf16(p.up, {E, I, H});
  const at::Tensor down = bf16(p.down, {E, H, I});
  const auto lora = [&](int64_t rows, int64_t cols, double value) {
    return at::full({E, rows, cols}, value, at::kBFloat16).set_requires_grad(true);
  };
  const at::Tensor a_gate = lora(r, H, 1e-2), b_gate = lora(I, r, 1e-3);
  const at::Tensor a_up = lora(r, H, 1e-2), b_up = lora(I, r, 1e-3);
  const at::Tensor a_down = lora(r, I, 1e-2), b_down = lora(H, r, 1e-3);
  const at::Tensor x0 = bf16(p.x, {T, H}), dy = bf16(p.dy, {T, H});
  const at::Tensor ids =
      at::from_blob(const_cast<int32_t*>(p.ids.data()), {T, k}, at::kInt).to(at::kLong);
  const at::Tensor w0 =
      at::from_blob(const_cast<float*>(p.weights.data()), {T, k}, at::kFloat).to(at::kBFloat16);

  std::vector<double> fwd, bwd;
  for (int rep = 0; rep <= repeats; ++rep) {
    const at::Tensor x = x0.detach().clone().set_requires_grad(true);
    const at::Tensor routing_w = w0.detach().clone().set_requires_grad(true);
    const auto t0 = Clock::now();
    at::Tensor y = at::zeros({T, H}, at::kBFloat16);
    // transformers' loop: one_hot mask, then per expert the (token, slot) pairs routed to it.
    const at::Tensor mask = at::one_hot(ids, E).permute({2, 1, 0});  // [E, k, T]
    const at::Tensor hit = at::nonzero(mask.sum({1, 2}) > 0).flatten();
    const int64_t* hit_ptr = hit.data_ptr<int64_t>();
    for (int64_t i = 0; i < hit.numel(); ++i) {
      const int64_t e = hit_ptr[i];
      const std::vector<at::Tensor> where = at::where(mask[e]);  // slot, token
      const at::Tensor& slot = where[0];
      const at::Tensor& token = where[1];
      const at::Tensor xe = x.index_select(0, token);
      const double s = p.lora_scale;
      const at::Tensor h = at::silu(project(xe, gate[e], a_gate[e], b_gate[e], s)) *
                           project(xe, up[e], a_up[e], b_up[e], s);
      const at::Tensor o = project(h, down[e], a_down[e], b_down[e], s);
      const at::Tensor w = routing_w.index({token, slot}).unsqueeze(1);
      y = y.index_add(0, token, o * w);
    }
    const double f = msSince(t0);
    const auto t1 = Clock::now();
    torch::autograd::backward({y}, {dy});
    const double b = msSince(t1);
    for (const at::Tensor* param : {&a_gate, &b_gate, &a_up, &b_up, &a_down, &b_down}) {
      param->mutable_grad().reset();
    }
    if (rep == 0) continue;
    fwd.push_back(f);
    bwd.push_back(b);
  }
  std::sort(fwd.begin(), fwd.end());
  std::sort(bwd.begin(), bwd.end());
  return {fwd[fwd.size() / 2], bwd[bwd.size() / 2]};
}

}  // namespace tandem::bench
