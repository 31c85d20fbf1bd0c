#include "engine/model/moe_function.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/core/error.h"
#include "engine/experts/expert_forward_cache.h"
#include "engine/experts/expert_layer.h"
#include "engine/experts/expert_routing.h"
#include "engine/gpu/chunked_loss.h"
#include "engine/model/torch_experts.h"

namespace tandem::model {

namespace {

std::atomic<int64_t> reused_forwards{0};

bool sameBytes(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.sizes() == b.sizes() &&
         a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// A host buffer for what crosses between the device and the CPU engine: pinned when the device is
// a GPU. Pageable copies ran at ~6 GB/s on the H200 machine, a sixth of a step with resident
// experts; pinned ones at the link's speed, and the copy to the device does not block the host.
at::Tensor hostBuffer(at::IntArrayRef sizes, at::ScalarType dtype, at::Device device) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).pinned_memory(device.is_cuda()));
}

at::Tensor toHost(const at::Tensor& t, at::ScalarType dtype) {
  if (!t.is_cuda()) return t.to(at::kCPU, dtype).contiguous();  // no copy when it already is
  return hostBuffer(t.sizes(), dtype, t.device()).copy_(t);  // waits: the CPU engine reads it next
}

at::Tensor toDevice(const at::Tensor& host, at::Device device) {
  // From pinned memory the copy is queued behind the device's work; the caching host allocator
  // keeps the buffer until it ran.
  return host.to(device, /*non_blocking=*/device.is_cuda());
}

experts::ActivationType activationType(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat) return experts::ActivationType::F32;
  if (t.scalar_type() == at::kBFloat16) return experts::ActivationType::BF16;
  throw Error(
      std::string("routed experts run in fp32 or bf16, not ") + c10::toString(t.scalar_type()),
      "load the model with --dtype fp32 or bf16");
}

class RoutedExpertsBackward : public torch::autograd::Node {
 public:
  RoutedExpertsBackward(experts::ExpertLayer& layer,
                        std::unique_ptr<experts::ExpertForwardCache> cache, at::Device device,
                        at::ScalarType dtype, int64_t n_tokens, int64_t top_k, CpuTokens tokens)
      : layer_(layer),
        cache_(std::move(cache)),
        device_(device),
        dtype_(dtype),
        n_tokens_(n_tokens),
        top_k_(top_k),
        tokens_(std::move(tokens)) {}

  // The device's parts of the call: their inputs, to recompute them in backward.
  void addDeviceParts(std::vector<std::shared_ptr<const TorchExpertsCall>> calls, at::Tensor hidden,
                      at::Tensor topk_weights) {
    on_device_ = std::move(calls);
    hidden_ = std::move(hidden);
    topk_weights_ = std::move(topk_weights);
  }

  std::string name() const override { return "tandem::RoutedExpertsBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const int64_t hidden = layer_.spec().hidden;
    at::Tensor d_out = grads[0];
    if (!d_out.defined())
      d_out = at::zeros({n_tokens_, hidden}, at::TensorOptions().dtype(dtype_).device(device_));
    const at::Tensor dy = toHost(tokens_.gather(d_out), dtype_);
    // Queued on the device before the CPU starts, collected after it finished. The copies
    // (streamed experts) start first, so they overlap the parts queued before their use.
    for (const auto& part : on_device_) part->prefetch();
    std::vector<TorchExpertsCall::Gradients> part_grads;
    TorchExpertsCall::Gradients device_grads;
    for (const auto& part : on_device_) {
      part_grads.push_back(part->backward(hidden_, topk_weights_, d_out));
      const TorchExpertsCall::Gradients& g = part_grads.back();
      device_grads.d_hidden =
          device_grads.d_hidden.defined() ? device_grads.d_hidden + g.d_hidden : g.d_hidden;
      device_grads.d_topk_weights = device_grads.d_topk_weights.defined()
                                        ? device_grads.d_topk_weights + g.d_topk_weights
                                        : g.d_topk_weights;
    }
    at::Tensor dx = hostBuffer({dy.size(0), hidden}, dtype_, device_);
    at::Tensor d_weights = hostBuffer({dy.size(0), top_k_}, at::kFloat, device_);
    {
      RECORD_USER_SCOPE("tandem::cpu_experts_backward");
      layer_.backward(*cache_, dy.data_ptr(), dx.data_ptr(), d_weights.data_ptr<float>());
    }
    cache_.reset();
    torch::autograd::variable_list result(3);
    for (size_t i = 0; i < on_device_.size(); ++i) on_device_[i]->accumulateLora(part_grads[i]);
    if (should_compute_output(0)) {
      result[0] = tokens_.scatter(toDevice(dx, device_), n_tokens_, device_grads.d_hidden);
    }
    if (should_compute_output(1)) {
      result[1] =
          tokens_.scatter(toDevice(d_weights, device_), n_tokens_, device_grads.d_topk_weights);
    }
    release_variables();
    return result;  // the anchor gets no gradient: the LoRA grads live in the engine
  }

  void release_variables() override {
    cache_.reset();
    on_device_.clear();
    hidden_.reset();
    topk_weights_.reset();
  }

 private:
  experts::ExpertLayer& layer_;
  std::unique_ptr<experts::ExpertForwardCache> cache_;
  at::Device device_;
  at::ScalarType dtype_;
  int64_t n_tokens_;
  int64_t top_k_;
  CpuTokens tokens_;
  std::vector<std::shared_ptr<const TorchExpertsCall>> on_device_;
  at::Tensor hidden_, topk_weights_;  // on the device, detached: the device part's inputs
};

}  // namespace

CpuTokens CpuTokens::of(const at::Tensor& ids, at::Device device) {
  const int64_t n_tokens = ids.size(0), top_k = ids.size(1);
  const int32_t* id = ids.data_ptr<int32_t>();
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (std::any_of(id + t * top_k, id + (t + 1) * top_k,
                    [](int32_t e) { return e != experts::kMaskedSlot; })) {
      rows.push_back(t);
    }
  }
  const auto n_rows = static_cast<int64_t>(rows.size());
  if (n_rows == n_tokens || n_rows == 0) return {};
  at::Tensor host = hostBuffer({n_rows}, at::kLong, device);
  std::copy(rows.begin(), rows.end(), host.data_ptr<int64_t>());
  return {host, toDevice(host, device)};
}

at::Tensor CpuTokens::gather(const at::Tensor& t) const {
  if (!rows.defined()) return t;
  return t.index_select(0, t.is_cpu() ? host_rows : rows);
}

at::Tensor CpuTokens::scatter(const at::Tensor& part, int64_t n_tokens,
                              const at::Tensor& onto) const {
  if (!rows.defined()) return onto.defined() ? onto + part : part;
  std::vector<int64_t> sizes = part.sizes().vec();
  sizes[0] = n_tokens;
  const at::Tensor base = onto.defined() ? onto : at::zeros(sizes, part.options());
  return base.index_add(0, rows, part.to(base.scalar_type()));
}

KeptExpertForward::KeptExpertForward() = default;
KeptExpertForward::~KeptExpertForward() = default;
KeptExpertForward::KeptExpertForward(KeptExpertForward&&) noexcept = default;
KeptExpertForward& KeptExpertForward::operator=(KeptExpertForward&&) noexcept = default;

void KeptExpertForward::clear() {
  ids = weights = y = at::Tensor();
  cache.reset();
  y_charge = MemoryCharge();
}

int64_t reusedExpertForwards() { return reused_forwards.load(); }

at::Tensor routedExperts(experts::ExpertLayer& layer, const at::Tensor& hidden,
                         const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                         const at::Tensor& lora_anchor, const std::function<void()>& while_cpu_runs,
                         KeptExpertForward* keep,
                         std::shared_ptr<const TorchExpertsCall> on_device) {
  std::vector<std::shared_ptr<const TorchExpertsCall>> parts;
  if (on_device) parts.push_back(std::move(on_device));
  return routedExperts(layer, hidden, topk_ids, topk_weights, lora_anchor, while_cpu_runs, keep,
                       std::move(parts));
}

at::Tensor routedExperts(experts::ExpertLayer& layer, const at::Tensor& hidden,
                         const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                         const at::Tensor& lora_anchor, const std::function<void()>& while_cpu_runs,
                         KeptExpertForward* keep,
                         std::vector<std::shared_ptr<const TorchExpertsCall>> on_device) {
  const experts::ActivationType act = activationType(hidden);
  const int64_t n_tokens = hidden.size(0);
  const int64_t top_k = topk_ids.size(1);
  at::Tensor x_cpu, ids_cpu, weights_cpu;
  CpuTokens tokens;
  {
    at::NoGradGuard no_grad;
    ids_cpu = toHost(topk_ids, at::kInt);
    if (!on_device.empty()) tokens = CpuTokens::of(ids_cpu, hidden.device());
    x_cpu = toHost(tokens.gather(hidden.detach()), hidden.scalar_type());
    ids_cpu = tokens.gather(ids_cpu);  // contiguous: toHost's, or index_select's
    weights_cpu = tokens.gather(toHost(topk_weights.detach(), at::kFloat));
  }
  const int64_t n_cpu_tokens = x_cpu.size(0);
  const bool needs_graph =
      torch::autograd::compute_requires_grad(hidden, topk_weights, lora_anchor);
  at::Tensor y_device;
  const at::Tensor device_weights =
      on_device.empty() ? at::Tensor() : topk_weights.detach().to(hidden.device(), at::kFloat);
  auto queue_device_work = [&] {
    for (const auto& part : on_device) part->prefetch();
    for (const auto& part : on_device) {
      const at::Tensor y_part =
          part->forward(hidden, device_weights, needs_graph && gpu::inCheckpointRecompute());
      y_device = y_device.defined() ? y_device + y_part : y_part;
    }
    if (while_cpu_runs) while_cpu_runs();
  };
  // The checkpointed pass: no graph now, but a backward (with a recomputation) will follow.
  const bool keeping = keep && !needs_graph;
  std::unique_ptr<experts::ExpertForwardCache> cache;
  at::Tensor y_cpu;
  const bool reuse = keep && needs_graph && keep->cache &&
                     keep->cache->cachedInputIs(x_cpu.data_ptr(), x_cpu.nbytes()) &&
                     sameBytes(keep->ids, ids_cpu) && sameBytes(keep->weights, weights_cpu);
  if (reuse) {
    cache = std::move(keep->cache);
    y_cpu = keep->y;
    keep->clear();
    reused_forwards.fetch_add(1);
    queue_device_work();
  } else {
    if (keep) keep->clear();  // stale (inputs differ): recompute as without it
    if (needs_graph || keeping) cache = std::make_unique<experts::ExpertForwardCache>();
    y_cpu = hostBuffer(x_cpu.sizes(), x_cpu.scalar_type(), hidden.device());
    queue_device_work();
    RECORD_USER_SCOPE("tandem::cpu_experts_forward");
    layer.forward(x_cpu.data_ptr(), act, n_cpu_tokens, ids_cpu.data_ptr<int32_t>(),
                  weights_cpu.data_ptr<float>(), static_cast<int>(top_k), y_cpu.data_ptr(),
                  cache.get());
  }
  if (keeping) {
    keep->ids = ids_cpu;
    keep->weights = weights_cpu;
    keep->y = y_cpu;
    keep->y_charge =
        MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Activations, y_cpu.nbytes());
    keep->cache = std::move(cache);
  }
  at::Tensor y;
  {
    at::NoGradGuard no_grad;
    y = tokens.scatter(toDevice(y_cpu, hidden.device()), n_tokens, y_device);
  }
  if (!needs_graph) return y;
  std::shared_ptr<RoutedExpertsBackward> node(
      new RoutedExpertsBackward(layer, std::move(cache), hidden.device(), hidden.scalar_type(),
                                n_tokens, top_k, std::move(tokens)),
      torch::autograd::deleteNode);
  if (!on_device.empty())
    node->addDeviceParts(std::move(on_device), hidden.detach(), device_weights);
  node->set_next_edges(torch::autograd::collect_next_edges(hidden, topk_weights, lora_anchor));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace tandem::model
