#include "engine/model/causal_lm.h"

#include <ATen/ATen.h>

#include "engine/core/error.h"
#include "engine/gpu/checkpoint_offload.h"
#include "engine/gpu/chunked_loss.h"
#include "engine/gpu/norm.h"
#include "engine/gpu/segmented_attention.h"

namespace tandem::model {

CausalLm::~CausalLm() = default;

at::Tensor DecoderLayer::forward(const at::Tensor& x, const gpu::RopeTables& rope, double eps,
                                 bool training, const gpu::SequenceSegments* segments) const {
  const at::Tensor normed = gpu::rmsNorm(x, input_layernorm, eps);
  const at::Tensor attn = gqa ? gqa->forward(normed, rope, training, segments)
                              : mla->forward(normed, rope, training, segments);
  const at::Tensor h = x + attn;
  const at::Tensor normed2 = gpu::rmsNorm(h, post_attention_layernorm, eps);
  return h + (moe ? moe->forward(normed2, training) : dense_mlp.forward(normed2, training));
}

namespace {

// The packed rows' segments completed to the batch width (padding a segment of its own), shared
// by every layer and by the checkpointed layers' recomputation after forwardHidden returns.
std::shared_ptr<const gpu::SequenceSegments> coveringSegmentsOf(const gpu::SequenceSegments* packed,
                                                                const at::Tensor& ids) {
  if (!packed) return nullptr;
  return std::make_shared<const gpu::SequenceSegments>(
      gpu::coveringSegments(*packed, ids.size(0), ids.size(1)));
}

}  // namespace

at::Tensor CausalLm::forwardHidden(const at::Tensor& input_ids, bool training,
                                   const gpu::SequenceSegments* packed) const {
  if (input_ids.dim() != 2) throw Error("input ids must be [batch, seq]");
  const at::Tensor ids = input_ids.to(embed_device_, at::kLong);
  if (ids.numel() > 0 &&
      (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= config_.vocab_size)) {
    throw Error(
        "a token id is outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")",
        "the tokens do not belong to this model's tokenizer");
  }
  at::Tensor x = at::embedding(embed_tokens, ids);
  at::Device rope_device = embed_device_;
  const std::shared_ptr<const gpu::SequenceSegments> segments = coveringSegmentsOf(packed, ids);
  const at::Tensor positions =
      segments ? gpu::segmentPositions(*segments, ids.size(0), ids.size(1)) : at::Tensor();
  auto ropeTablesOn = [&](const at::Device& device) {
    return segments ? rope_.tables(positions, device) : rope_.tables(ids.size(1), device);
  };
  gpu::RopeTables rope = ropeTablesOn(rope_device);
  const bool checkpoint =
      training && (options_.gradient_checkpointing || options_.offload_checkpoints);
  // With checkpointing, the layer inputs must carry grad for the recomputed layers' LoRA
  // weights to get theirs (PEFT's enable_input_require_grads).
  if (checkpoint) x = x.detach().requires_grad_(true);
  // Owned by the graph's checkpoint nodes from here: freed with the graph.
  const std::shared_ptr<gpu::CheckpointOffload> offload =
      checkpoint && options_.offload_checkpoints ? std::make_shared<gpu::CheckpointOffload>()
                                                 : nullptr;
  const double eps = config_.rms_norm_eps;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const DecoderLayer& layer = layers_[i];
    // Only the activations cross to the layer's device (autograd sends their gradient back).
    const at::Device device = layer_devices_[i];
    if (device != rope_device) {
      rope_device = device;
      rope = ropeTablesOn(device);
    }
    x = x.to(device);
    if (checkpoint) {
      // Captures by value what the backward's recomputation needs after this call returns.
      x = gpu::checkpointed(
          [&layer, rope, eps, segments](const at::Tensor& in) {
            return layer.forward(in, rope, eps, /*training=*/true, segments.get());
          },
          x, offload);
    } else {
      x = layer.forward(x, rope, eps, training, segments.get());
    }
  }
  return gpu::rmsNorm(x.to(head_device_), final_norm, eps);
}

at::Tensor CausalLm::logits(const at::Tensor& hidden) const {
  if (lm_head_few_row_) {
    at::Tensor y = gpu::fewRowLinear(*lm_head_few_row_, hidden, lm_head.size(1), lm_head.size(0));
    if (y.defined()) return y;
  }
  return at::linear(hidden, lm_head).to(at::kFloat);
}

at::Tensor CausalLm::loss(const at::Tensor& hidden, const at::Tensor& labels) const {
  if (labels.sizes() != hidden.sizes().slice(0, 2)) {
    throw Error("labels must have the same [batch, seq] shape as the tokens");
  }
  // Position t predicts label t+1; the last position of each row predicts nothing.
  const at::Tensor lab = labels.to(head_device_, at::kLong);
  const at::Tensor shifted = at::cat(
      {lab.narrow(1, 1, lab.size(1) - 1), at::full({lab.size(0), 1}, -100, lab.options())}, 1);
  return gpu::chunkedCrossEntropy(hidden.reshape({-1, hidden.size(-1)}), lm_head,
                                  shifted.reshape({-1}), options_.loss_chunk_tokens);
}

void CausalLm::visitLinears(
    const std::function<void(const std::string&, gpu::LoraLinear&)>& visit) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    DecoderLayer& layer = layers_[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto under = [&](const std::string& prefix) {
      return [&visit, prefix](const std::string& leaf, gpu::LoraLinear& l) {
        visit(prefix + leaf, l);
      };
    };
    if (layer.gqa) layer.gqa->visitProjections(under(p + "self_attn."));
    if (layer.mla) layer.mla->visitProjections(under(p + "self_attn."));
    if (layer.dense_mlp.defined()) layer.dense_mlp.visitProjections(under(p + "mlp."));
    if (layer.moe) {
      visit(p + "mlp.gate", layer.moe->router.gate);
      const std::string shared = config_.architecture == io::Architecture::Qwen2Moe
                                     ? p + "mlp.shared_expert."
                                     : p + "mlp.shared_experts.";
      if (layer.moe->shared.defined()) layer.moe->shared.visitProjections(under(shared));
      if (layer.moe->shared_gate.defined())
        visit(p + "mlp.shared_expert_gate", layer.moe->shared_gate);
    }
  }
}

void CausalLm::visitMoeBlocks(const std::function<void(const std::string&, MoeBlock&)>& visit) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].moe) visit("model.layers." + std::to_string(i) + ".mlp", *layers_[i].moe);
  }
}

void CausalLm::visitMoeBlocks(
    const std::function<void(size_t layer, const MoeBlock&)>& visit) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].moe) visit(i, *layers_[i].moe);
  }
}

}  // namespace tandem::model
