#include "engine/gpu/chunked_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "engine/gpu/checkpoint_offload.h"

namespace tandem::gpu {

namespace {

constexpr int64_t kIgnoreIndex = -100;

// logits of one chunk in fp32, and its targets with ignored rows pointed at class 0.
struct ChunkLogits {
  at::Tensor logits;  // [n, V] fp32
  at::Tensor keep;    // [n] bool
  at::Tensor safe_targets;
};

ChunkLogits chunkLogits(const at::Tensor& hidden, const at::Tensor& lm_head,
                        const at::Tensor& targets, int64_t begin, int64_t n) {
  ChunkLogits c;
  c.logits = at::linear(hidden.narrow(0, begin, n), lm_head).to(at::kFloat);
  const at::Tensor t = targets.narrow(0, begin, n);
  c.keep = t.ne(kIgnoreIndex);
  c.safe_targets = at::where(c.keep, t, at::zeros_like(t));
  return c;
}

class ChunkedCrossEntropyBackward : public torch::autograd::Node {
 public:
  ChunkedCrossEntropyBackward(at::Tensor hidden, at::Tensor lm_head, at::Tensor targets,
                              int64_t chunk_tokens, int64_t kept)
      : hidden_(std::move(hidden)),
        lm_head_(std::move(lm_head)),
        targets_(std::move(targets)),
        chunk_tokens_(chunk_tokens),
        kept_(kept) {}

  std::string name() const override { return "tandem::ChunkedCrossEntropyBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::NoGradGuard no_grad;
    at::Tensor d_hidden = at::zeros_like(hidden_);
    if (kept_ > 0 && grads[0].defined()) {
      const at::Tensor scale = grads[0].to(at::kFloat) / static_cast<double>(kept_);
      for (int64_t begin = 0; begin < hidden_.size(0); begin += chunk_tokens_) {
        const int64_t n = std::min(chunk_tokens_, hidden_.size(0) - begin);
        const ChunkLogits c = chunkLogits(hidden_, lm_head_, targets_, begin, n);
        // d loss / d logits = (softmax - onehot) / kept, on kept rows only.
        at::Tensor d_logits = at::softmax(c.logits, -1);
        d_logits.scatter_add_(1, c.safe_targets.unsqueeze(1),
                              at::full({n, 1}, -1.0, d_logits.options()));
        d_logits = d_logits * c.keep.unsqueeze(1).to(at::kFloat) * scale;
        d_hidden.narrow(0, begin, n)
            .copy_(at::matmul(d_logits.to(lm_head_.scalar_type()), lm_head_));
      }
    }
    return {d_hidden};
  }

  void release_variables() override {
    hidden_.reset();
    targets_.reset();
  }

 private:
  at::Tensor hidden_, lm_head_, targets_;
  int64_t chunk_tokens_;
  int64_t kept_;
};

thread_local bool recomputing = false;

// Sets `recomputing` for one layer's recomputation, restored also when the layer throws.
class RecomputeScope {
 public:
  RecomputeScope() : outer_(std::exchange(recomputing, true)) {}
  ~RecomputeScope() { recomputing = outer_; }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  bool outer_;
};

class CheckpointBackward : public torch::autograd::Node {
 public:
  CheckpointBackward(std::function<at::Tensor(const at::Tensor&)> layer, at::Tensor input)
      : layer_(std::move(layer)), input_(std::move(input)) {}
  // The input is slot `slot` of `offload`, in host memory until this backward asks for it.
  CheckpointBackward(std::function<at::Tensor(const at::Tensor&)> layer,
                     std::shared_ptr<CheckpointOffload> offload, int64_t slot)
      : layer_(std::move(layer)), offload_(std::move(offload)), slot_(slot) {}

  std::string name() const override { return "tandem::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::AutoGradMode grad_mode(true);
    at::Tensor saved = input_;
    if (offload_) {
      saved = offload_->take(slot_);
      // The layer before this one runs its backward next: its input travels back meanwhile.
      offload_->prefetch(slot_ - 1);
    }
    const at::Tensor x = saved.detach().requires_grad_(true);
    at::Tensor y;
    {
      RecomputeScope scope;
      y = layer_(x);
    }
    // Reentrant backward through the recomputed layer: LoRA leaves inside accumulate their
    // .grad, the experts their buffers, and x receives the gradient we pass on.
    torch::autograd::backward({y}, {grads[0]});
    at::Tensor dx = x.grad();
    release_variables();
    return {dx};
  }

  void release_variables() override {
    input_.reset();
    offload_.reset();
  }

 private:
  std::function<at::Tensor(const at::Tensor&)> layer_;
  at::Tensor input_;
  std::shared_ptr<CheckpointOffload> offload_;
  int64_t slot_ = -1;
};

}  // namespace

bool inCheckpointRecompute() { return recomputing; }

at::Tensor chunkedCrossEntropy(const at::Tensor& hidden, const at::Tensor& lm_head,
                               const at::Tensor& targets, int64_t chunk_tokens) {
  chunk_tokens = std::max<int64_t>(chunk_tokens, 1);
  const int64_t kept = targets.ne(kIgnoreIndex).sum().item<int64_t>();
  at::Tensor loss_sum = at::zeros({}, hidden.options().dtype(at::kFloat));
  {
    at::NoGradGuard no_grad;
    for (int64_t begin = 0; begin < hidden.size(0); begin += chunk_tokens) {
      const int64_t n = std::min(chunk_tokens, hidden.size(0) - begin);
      const ChunkLogits c = chunkLogits(hidden, lm_head, targets, begin, n);
      const at::Tensor nll =
          at::logsumexp(c.logits, -1) - c.logits.gather(1, c.safe_targets.unsqueeze(1)).squeeze(1);
      loss_sum += (nll * c.keep.to(at::kFloat)).sum();
    }
  }
  at::Tensor loss = kept > 0
                        ? loss_sum / static_cast<double>(kept)
                        : at::full({}, std::numeric_limits<float>::quiet_NaN(), loss_sum.options());
  if (!torch::autograd::compute_requires_grad(hidden)) return loss;
  std::shared_ptr<ChunkedCrossEntropyBackward> node(
      new ChunkedCrossEntropyBackward(hidden.detach(), lm_head.detach(), targets, chunk_tokens,
                                      kept),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(hidden));
  torch::autograd::set_history(loss, node);
  return loss;
}

at::Tensor checkpointed(const std::function<at::Tensor(const at::Tensor&)>& layer,
                        const at::Tensor& x, const std::shared_ptr<CheckpointOffload>& offload) {
  const bool backward_follows = torch::autograd::compute_requires_grad(x);
  // Stored before the layer runs: on a GPU the copy out overlaps the layer's forward.
  const int64_t slot = backward_follows && offload ? offload->store(x.detach()) : -1;
  at::Tensor y;
  {
    at::NoGradGuard no_grad;
    y = layer(x);
  }
  if (!backward_follows) return y;
  std::shared_ptr<CheckpointBackward> node(offload ? new CheckpointBackward(layer, offload, slot)
                                                   : new CheckpointBackward(layer, x.detach()),
                                           torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace tandem::gpu
