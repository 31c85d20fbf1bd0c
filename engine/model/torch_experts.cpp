#include "engine/model/torch_experts.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <array>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>

#include "engine/gpu/chunked_loss.h"
#include "engine/gpu/row_scale.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/model/weight_loader.h"

namespace tandem::model {

namespace {

using experts::ExpertLora;
using experts::ExpertProj;
using experts::kExpertProjCount;

// The LoRA matrices on the device: a [n, r, in], b [n, out, r] fp32 per targeted projection.
struct DeviceLora {
  std::array<at::Tensor, kExpertProjCount> a, b;
  float scale = 0;
};

at::Tensor hostView(std::span<float> buffer, int64_t experts, int64_t rows, int64_t cols) {
  return at::from_blob(buffer.data(), {experts, rows, cols}, at::kFloat);
}

// Copies A and B of the computed experts (all when `global_ids` is undefined: on the CPU device
// then views of the buffers) to `device`; leaves that require grad when `trainable`.
DeviceLora streamLora(ExpertLora& lora, const at::Tensor& global_ids, at::Device device,
                      bool trainable) {
  DeviceLora out;
  out.scale = lora.scale();
  for (int p = 0; p < kExpertProjCount; ++p) {
    const auto proj = static_cast<ExpertProj>(p);
    if (!lora.targets(proj)) continue;
    const int64_t e = lora.numExperts(), r = lora.rank();
    at::Tensor a = hostView(lora.allA(proj), e, r, lora.inFeatures(proj));
    at::Tensor b = hostView(lora.allB(proj), e, lora.outFeatures(proj), r);
    if (global_ids.defined()) {
      a = a.index_select(0, global_ids);
      b = b.index_select(0, global_ids);
    }
    out.a[p] = a.to(device);
    out.b[p] = b.to(device);
    if (trainable) {
      out.a[p] = out.a[p].detach().requires_grad_(true);
      out.b[p] = out.b[p].detach().requires_grad_(true);
    }
  }
  return out;
}

// rows [P, in] grouped by expert (g.counts) -> [P, out]: each group's rows times its expert's
// weight [n, out, in] transposed.
at::Tensor groupedLinear(const at::Tensor& rows, const at::Tensor& weight, const ExpertGrouping& g,
                         ExpertGemm gemm) {
  if (gemm == ExpertGemm::Grouped) return at::_grouped_mm(rows, weight.transpose(1, 2), g.offsets);
  std::vector<at::Tensor> outs;
  int64_t offset = 0;
  for (size_t e = 0; e < g.counts.size(); ++e) {
    const int64_t n = g.counts[e];
    if (n == 0) continue;
    outs.push_back(at::linear(rows.narrow(0, offset, n), weight[static_cast<int64_t>(e)]));
    offset += n;
  }
  return at::cat(outs);
}

struct Kernels {
  ExpertGemm frozen, lora;
};

// rows [P, in] model dtype -> [P, out]: rows Wᵀ (⊙ the row scales of int8 weights, in fp32) +
// s · (rows Aᵀ) Bᵀ per expert, the LoRA branch in fp32.
at::Tensor project(const at::Tensor& rows, const at::Tensor& weight, const at::Tensor& row_scale,
                   const DeviceLora& lora, ExpertProj proj, const ExpertGrouping& g,
                   Kernels kernels) {
  const int p = static_cast<int>(proj);
  const bool has_lora = lora.a[p].defined();
  at::Tensor y = groupedLinear(rows, weight, g, kernels.frozen);
  if (row_scale.defined()) {
    // fp32 when the LoRA delta is added next, as the unscaled path's (y + delta) in fp32.
    y = gpu::scaleRowsByExpert(y, row_scale, g.pair_expert,
                               has_lora ? at::kFloat : rows.scalar_type());
  }
  if (!has_lora) return y.to(rows.scalar_type());
  const at::Tensor low = groupedLinear(rows.to(at::kFloat), lora.a[p], g, kernels.lora);
  const at::Tensor delta = groupedLinear(low, lora.b[p], g, kernels.lora) * lora.scale;
  return (y + delta).to(rows.scalar_type());
}

// x [T, H], weights [T, k] fp32 -> [T, H] in x's dtype; differentiable in x, weights and the
// LoRA leaves.
at::Tensor expertsForward(const TorchExpertWeights& w, const DeviceLora& lora,
                          const ExpertGrouping& g, const at::Tensor& x, const at::Tensor& weights,
                          Kernels kernels) {
  const at::Tensor rows = x.index_select(0, g.pair_token);  // [P, H]
  const at::Tensor h =
      at::silu(project(rows, w.gate, w.gate_scale, lora, ExpertProj::Gate, g, kernels)) *
      project(rows, w.up, w.up_scale, lora, ExpertProj::Up, g, kernels);
  const at::Tensor out = project(h, w.down, w.down_scale, lora, ExpertProj::Down, g, kernels);
  const at::Tensor pair_weight = weights.reshape({-1}).index_select(0, g.order).unsqueeze(1);
  const at::Tensor weighted = out.to(at::kFloat) * pair_weight;  // [P, H] fp32
  return at::zeros({x.size(0), x.size(1)}, weighted.options())
      .index_add(0, g.pair_token, weighted)
      .to(x.scalar_type());
}

Kernels kernelsFor(const TorchExpertWeights& w, const ExpertLora& lora, const at::Tensor& x,
                   std::optional<ExpertGemm> forced) {
  if (forced) return {*forced, *forced};
  const int64_t hidden = w.gate.size(2), intermediate = w.gate.size(1);
  return {expertGemmFor(x.device(), x.scalar_type(), {hidden, intermediate}),
          expertGemmFor(x.device(), at::kFloat, {hidden, intermediate, lora.rank()})};
}

class TorchExpertsBackward : public torch::autograd::Node {
 public:
  TorchExpertsBackward(TorchExpertsCall call, at::Tensor hidden, at::Tensor topk_weights)
      : call_(std::move(call)),
        hidden_(std::move(hidden)),
        topk_weights_(std::move(topk_weights)) {}

  std::string name() const override { return "tandem::TorchExpertsBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor dy = grads[0];
    if (!dy.defined()) dy = at::zeros_like(hidden_);
    const TorchExpertsCall::Gradients d = call_.backward(hidden_, topk_weights_, dy);
    call_.accumulateLora(d);
    release_variables();
    torch::autograd::variable_list result(3);
    if (should_compute_output(0)) result[0] = d.d_hidden;
    if (should_compute_output(1)) result[1] = d.d_topk_weights;
    return result;  // the anchor gets no gradient: the LoRA grads live in the host buffers
  }

  void release_variables() override {
    hidden_.reset();
    topk_weights_.reset();
  }

 private:
  TorchExpertsCall call_;
  at::Tensor hidden_, topk_weights_;
};

}  // namespace

uint64_t TorchExpertWeights::bytes() const {
  uint64_t total = 0;
  for (const at::Tensor* t : {&gate, &up, &down, &gate_scale, &up_scale, &down_scale}) {
    if (t->defined()) total += t->nbytes();
  }
  return total;
}

int64_t ExpertGrouping::pairs() const {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

ExpertGemm expertGemmFor(at::Device device, at::ScalarType dtype,
                         const std::vector<int64_t>& row_lengths) {
  const auto element = static_cast<int64_t>(c10::elementSize(dtype));
  for (int64_t length : row_lengths) {
    if (length <= 0 || length * element % 16 != 0) return ExpertGemm::PerExpert;
  }
  if (device.is_cpu()) return ExpertGemm::Grouped;
  // Other GPUs or dtypes get torch's fallback, a loop that first waits for the device.
  if (!device.is_cuda() || dtype != at::kBFloat16) return ExpertGemm::PerExpert;
  const int major = gpu::gpuComputeMajor(device.has_index() ? device.index() : 0);
  return major == 9 || major == 10 ? ExpertGemm::Grouped : ExpertGemm::PerExpert;
}

TorchExpertWeights stackExpertWeights(const experts::ExpertLayerSpec& spec,
                                      const experts::ExpertWeightViews& views,
                                      const std::vector<int64_t>& experts,
                                      const at::TensorOptions& options) {
  const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  const bool fp8 = views.type == experts::WeightType::FP8_E4M3;
  const auto n = static_cast<int64_t>(experts.size());
  // fp8 checkpoints: dequantised here with their block scales (torch computes in `dtype`).
  auto stack = [&](const std::vector<const void*>& ptrs, const std::vector<const float*>& scales,
                   int64_t rows, int64_t cols) {
    at::Tensor stacked = at::empty({n, rows, cols}, options);
    for (int64_t i = 0; i < n; ++i) {
      const auto e = static_cast<size_t>(experts[static_cast<size_t>(i)]);
      const at::Tensor stored =
          at::from_blob(const_cast<void*>(ptrs[e]), {rows, cols},
                        at::TensorOptions().dtype(fp8 ? at::kFloat8_e4m3fn : dtype));
      if (!fp8) {
        stacked[i].copy_(stored);
        continue;
      }
      const int64_t block = experts::kFp8BlockSize;
      const at::Tensor scale =
          at::from_blob(const_cast<float*>(scales[e]),
                        {(rows + block - 1) / block, (cols + block - 1) / block}, at::kFloat);
      stacked[i].copy_(dequantizeFp8Blocks(stored, scale, dtype));
    }
    return stacked;
  };
  return {stack(views.gate, views.gate_scale, spec.intermediate, spec.hidden),
          stack(views.up, views.up_scale, spec.intermediate, spec.hidden),
          stack(views.down, views.down_scale, spec.hidden, spec.intermediate)};
}

ExpertGrouping groupByExpert(const at::Tensor& local_ids, int64_t n_experts, at::Device device) {
  const at::Tensor ids = local_ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t top_k = ids.size(1), n_slots = ids.numel();
  const int64_t* id = ids.data_ptr<int64_t>();
  ExpertGrouping g;
  g.counts.assign(static_cast<size_t>(n_experts), 0);
  for (int64_t s = 0; s < n_slots; ++s) {
    if (id[s] >= 0) ++g.counts[static_cast<size_t>(id[s])];
  }
  // A counting sort: each expert's slots in slot order (what a stable argsort gives).
  std::vector<int64_t> next(static_cast<size_t>(n_experts), 0);
  std::exclusive_scan(g.counts.begin(), g.counts.end(), next.begin(), int64_t{0});
  const auto host = at::TensorOptions().pinned_memory(device.is_cuda());
  at::Tensor order = at::empty({g.pairs()}, host.dtype(at::kLong));
  at::Tensor pair_token = at::empty({g.pairs()}, host.dtype(at::kLong));
  at::Tensor offsets = at::empty({n_experts}, host.dtype(at::kInt));
  at::Tensor pair_expert = at::empty({g.pairs()}, host.dtype(at::kLong));
  int64_t* o = order.data_ptr<int64_t>();
  int64_t* t = pair_token.data_ptr<int64_t>();
  int64_t* e = pair_expert.data_ptr<int64_t>();
  for (int64_t s = 0; s < n_slots; ++s) {
    if (id[s] < 0) continue;
    const int64_t pos = next[static_cast<size_t>(id[s])]++;
    o[pos] = s;
    t[pos] = s / top_k;
    e[pos] = id[s];
  }
  std::inclusive_scan(g.counts.begin(), g.counts.end(), offsets.data_ptr<int32_t>(), std::plus<>(),
                      int32_t{0});
  // Asynchronous from pinned memory: the copy does not wait for work queued on the device.
  const bool async = device.is_cuda();
  g.order = order.to(device, async);
  g.pair_token = pair_token.to(device, async);
  g.offsets = offsets.to(device, async);
  g.pair_expert = pair_expert.to(device, async);
  return g;
}

std::vector<ExpertGrouping> groupByExpertPerChunk(const at::Tensor& local_ids, int64_t n_experts,
                                                  at::Device device, int64_t chunk_tokens) {
  const int64_t tokens = local_ids.size(0);
  if (chunk_tokens <= 0 || chunk_tokens >= tokens)
    return {groupByExpert(local_ids, n_experts, device)};
  const at::Tensor ids = local_ids.to(at::kCPU, at::kLong).contiguous();
  std::vector<ExpertGrouping> chunks;
  for (int64_t begin = 0; begin < tokens; begin += chunk_tokens) {
    chunks.push_back(groupByExpert(ids.narrow(0, begin, std::min(chunk_tokens, tokens - begin)),
                                   n_experts, device));
  }
  return chunks;
}

TorchExpertsCall::TorchExpertsCall(std::function<TorchExpertWeights()> weights, ExpertLora& lora,
                                   at::Tensor global_ids, ExpertGrouping grouping,
                                   std::optional<ExpertGemm> gemm)
    : weights_(std::move(weights)), lora_(lora), global_ids_(std::move(global_ids)), gemm_(gemm) {
  chunks_.push_back(std::move(grouping));
}

TorchExpertsCall::TorchExpertsCall(std::function<TorchExpertWeights()> weights, ExpertLora& lora,
                                   at::Tensor global_ids, std::vector<ExpertGrouping> chunks,
                                   int64_t chunk_tokens, std::optional<ExpertGemm> gemm)
    : weights_(std::move(weights)),
      lora_(lora),
      global_ids_(std::move(global_ids)),
      chunks_(std::move(chunks)),
      chunk_tokens_(chunk_tokens),
      gemm_(gemm) {
  TORCH_CHECK(!chunks_.empty(), "TorchExpertsCall: no grouping");
  TORCH_CHECK(chunks_.size() == 1 || chunk_tokens_ > 0,
              "TorchExpertsCall: several chunks need their length");
}

int64_t TorchExpertsCall::pairs() const {
  int64_t total = 0;
  for (const ExpertGrouping& g : chunks_) total += g.pairs();
  return total;
}

void TorchExpertsCall::prefetch() const {
  if (prefetch_ && !graph_ && !kept_weights_ && pairs() > 0) prefetch_();
}

at::Tensor TorchExpertsCall::forward(const at::Tensor& hidden, const at::Tensor& topk_weights,
                                     bool keep_graph) const {
  // No pair here: nothing to compute (and every gradient is 0).
  if (pairs() == 0) return at::zeros({hidden.size(0), hidden.size(1)}, hidden.options());
  if (chunks_.size() > 1) return forwardInChunks(hidden, topk_weights, keep_graph);
  if (keep_graph) {
    graph_ = std::make_shared<Graph>(differentiableForward(hidden, topk_weights));
    return graph_->y.detach();
  }
  at::NoGradGuard no_grad;
  const TorchExpertWeights w = weights_();
  return expertsForward(w, streamLora(lora_, global_ids_, hidden.device(), /*trainable=*/false),
                        chunks_[0], hidden.detach(), topk_weights.detach().to(at::kFloat),
                        kernelsFor(w, lora_, hidden, gemm_));
}

TorchExpertsCall::Graph TorchExpertsCall::differentiableForward(
    const at::Tensor& hidden, const at::Tensor& topk_weights) const {
  at::AutoGradMode grad_mode(true);
  const at::Tensor x = hidden.detach().requires_grad_(true);
  const at::Tensor w = topk_weights.detach().to(at::kFloat).requires_grad_(true);
  const DeviceLora lora = streamLora(lora_, global_ids_, x.device(), /*trainable=*/true);
  const TorchExpertWeights weights = weights_();
  Graph graph{expertsForward(weights, lora, chunks_[0], x, w, kernelsFor(weights, lora_, x, gemm_)),
              {x, w}};
  for (int p = 0; p < kExpertProjCount; ++p) {
    if (lora.a[p].defined()) graph.inputs.insert(graph.inputs.end(), {lora.a[p], lora.b[p]});
  }
  return graph;
}

TorchExpertsCall::Gradients TorchExpertsCall::backward(const at::Tensor& hidden,
                                                       const at::Tensor& topk_weights,
                                                       const at::Tensor& dy) const {
  if (pairs() == 0) {
    return {at::zeros_like(hidden),
            at::zeros(topk_weights.sizes(), topk_weights.options().dtype(at::kFloat)),
            {}};
  }
  if (chunks_.size() > 1) return backwardInChunks(hidden, topk_weights, dy);
  const std::shared_ptr<Graph> graph =
      graph_ ? std::exchange(graph_, nullptr)
             : std::make_shared<Graph>(differentiableForward(hidden, topk_weights));
  at::AutoGradMode grad_mode(true);
  auto d = torch::autograd::grad({graph->y}, graph->inputs, {dy}, /*retain_graph=*/false,
                                 /*create_graph=*/false, /*allow_unused=*/true);
  Gradients out{d[0], d[1], {}};
  out.lora.assign(d.begin() + 2, d.end());
  return out;
}

at::Tensor TorchExpertsCall::forwardInChunks(const at::Tensor& hidden,
                                             const at::Tensor& topk_weights,
                                             bool keep_weights) const {
  at::NoGradGuard no_grad;
  auto w = std::make_shared<TorchExpertWeights>(weights_());
  if (keep_weights) kept_weights_ = w;
  const DeviceLora lora = streamLora(lora_, global_ids_, hidden.device(), /*trainable=*/false);
  const Kernels kernels = kernelsFor(*w, lora_, hidden, gemm_);
  const int64_t tokens = hidden.size(0);
  at::Tensor y = at::empty({tokens, hidden.size(1)}, hidden.options());
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const int64_t begin = static_cast<int64_t>(c) * chunk_tokens_;
    const int64_t length = std::min(chunk_tokens_, tokens - begin);
    at::Tensor out = y.narrow(0, begin, length);
    if (chunks_[c].pairs() == 0) {
      out.zero_();
      continue;
    }
    out.copy_(expertsForward(*w, lora, chunks_[c], hidden.narrow(0, begin, length).detach(),
                             topk_weights.narrow(0, begin, length).detach().to(at::kFloat),
                             kernels));
  }
  return y;
}

TorchExpertsCall::Gradients TorchExpertsCall::backwardInChunks(const at::Tensor& hidden,
                                                               const at::Tensor& topk_weights,
                                                               const at::Tensor& dy) const {
  const std::shared_ptr<TorchExpertWeights> w =
      kept_weights_ ? std::exchange(kept_weights_, nullptr)
                    : std::make_shared<TorchExpertWeights>(weights_());
  at::AutoGradMode grad_mode(true);
  // One set of LoRA leaves for every chunk: their gradients are summed over the chunks here.
  const DeviceLora lora = streamLora(lora_, global_ids_, hidden.device(), /*trainable=*/true);
  std::vector<at::Tensor> lora_leaves;
  for (int p = 0; p < kExpertProjCount; ++p) {
    if (lora.a[p].defined()) lora_leaves.insert(lora_leaves.end(), {lora.a[p], lora.b[p]});
  }
  const Kernels kernels = kernelsFor(*w, lora_, hidden, gemm_);
  const int64_t tokens = hidden.size(0);
  Gradients out{at::empty_like(hidden),
                at::empty(topk_weights.sizes(), topk_weights.options().dtype(at::kFloat)),
                std::vector<at::Tensor>(lora_leaves.size())};
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const int64_t begin = static_cast<int64_t>(c) * chunk_tokens_;
    const int64_t length = std::min(chunk_tokens_, tokens - begin);
    at::Tensor d_hidden = out.d_hidden.narrow(0, begin, length);
    at::Tensor d_weights = out.d_topk_weights.narrow(0, begin, length);
    if (chunks_[c].pairs() == 0) {
      d_hidden.zero_();
      d_weights.zero_();
      continue;
    }
    const at::Tensor x = hidden.narrow(0, begin, length).detach().requires_grad_(true);
    const at::Tensor tw =
        topk_weights.narrow(0, begin, length).detach().to(at::kFloat).requires_grad_(true);
    std::vector<at::Tensor> inputs{x, tw};
    inputs.insert(inputs.end(), lora_leaves.begin(), lora_leaves.end());
    const at::Tensor y = expertsForward(*w, lora, chunks_[c], x, tw, kernels);
    const auto d = torch::autograd::grad({y}, inputs, {dy.narrow(0, begin, length)},
                                         /*retain_graph=*/false, /*create_graph=*/false,
                                         /*allow_unused=*/true);
    d_hidden.copy_(d[0]);
    d_weights.copy_(d[1]);
    for (size_t i = 0; i < lora_leaves.size(); ++i) {
      const at::Tensor& g = d[i + 2];
      if (!g.defined()) continue;  // no pair of this chunk on an expert: that leaf unused
      out.lora[i] = out.lora[i].defined() ? out.lora[i].add_(g) : g;
    }
  }
  return out;
}

void TorchExpertsCall::accumulateLora(const Gradients& grads) const {
  if (grads.lora.empty()) return;
  // grad [n, rows, cols] of the computed experts -> += into their rows of host [E, rows, cols].
  auto add = [this](at::Tensor host, const at::Tensor& grad) {
    if (!grad.defined()) return;
    if (global_ids_.defined()) {
      host.index_add_(0, global_ids_, grad.to(at::kCPU));
    } else {
      host.add_(grad.to(at::kCPU));
    }
  };
  size_t next = 0;
  for (int p = 0; p < kExpertProjCount; ++p) {
    const auto proj = static_cast<ExpertProj>(p);
    if (!lora_.targets(proj)) continue;
    const int64_t e = lora_.numExperts(), r = lora_.rank();
    add(hostView(lora_.allGradA(proj), e, r, lora_.inFeatures(proj)), grads.lora[next++]);
    add(hostView(lora_.allGradB(proj), e, lora_.outFeatures(proj), r), grads.lora[next++]);
  }
}

at::Tensor torchExperts(TorchExpertsCall call, const at::Tensor& hidden,
                        const at::Tensor& topk_weights, const at::Tensor& lora_anchor) {
  const at::Tensor w = topk_weights.to(hidden.device(), at::kFloat);
  const bool needs_graph =
      torch::autograd::compute_requires_grad(hidden, topk_weights, lora_anchor);
  const at::Tensor y =
      call.forward(hidden, w, /*keep_graph=*/needs_graph && gpu::inCheckpointRecompute());
  if (call.pairs() == 0 || !needs_graph) return y;
  std::shared_ptr<TorchExpertsBackward> node(
      new TorchExpertsBackward(std::move(call), hidden.detach(), w.detach()),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(hidden, topk_weights, lora_anchor));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace tandem::model
