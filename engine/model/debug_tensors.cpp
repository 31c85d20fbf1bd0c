#include "engine/model/debug_tensors.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <map>
#include <string>

#include "engine/core/error.h"
#include "engine/gpu/segmented_attention.h"
#include "engine/model/causal_lm.h"
#include "engine/model/model.h"
#include "engine/model/peft_adapter.h"
#include "engine/model/weight_loader.h"

namespace tandem::model {

namespace {

at::Tensor rows(const TokenBatch& batch, const std::vector<int64_t>& values) {
  return at::from_blob(const_cast<int64_t*>(values.data()), {batch.rows, batch.width}, at::kLong)
      .clone();
}

}  // namespace

void writeDebugTensors(Model& model, const TokenBatch& batch, bool gradients,
                       const std::filesystem::path& out) {
  if (batch.input_ids.size() != static_cast<size_t>(batch.rows * batch.width))
    throw Error("a malformed token batch");
  const bool has_labels = !batch.labels.empty();
  if (gradients && !has_labels)
    throw Error("gradients need labels", "give a labels file shaped like the tokens");
  const at::Tensor ids = rows(batch, batch.input_ids);
  const at::Tensor labels = has_labels ? rows(batch, batch.labels) : at::Tensor();
  CausalLm& lm = model.lm();
  gpu::SequenceSegments packed;
  packed.lengths = batch.segment_lengths;
  const gpu::SequenceSegments* segments = batch.segment_lengths.empty() ? nullptr : &packed;
  std::map<std::string, at::Tensor> tensors;
  if (gradients) {
    const at::Tensor hidden = lm.forwardHidden(ids, /*training=*/true, segments);
    const at::Tensor loss = lm.loss(hidden, labels);
    torch::autograd::backward({loss});
    at::NoGradGuard no_grad;
    tensors["loss"] = loss.detach().to(at::kCPU);
    tensors["logits"] = lm.logits(hidden.detach()).to(at::kCPU);
    for (auto& [name, grad] : loraTensors(lm, /*gradients=*/true)) tensors[name] = grad;
    // LoRA experts' gradients under their saved names (lora_experts_files.h).
    lm.visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
      block.lora_experts.visitWeights(mlp, [&](const std::string& name, at::Tensor& w) {
        tensors["base_model.model." + name] =
            w.grad().defined() ? w.grad().to(at::kCPU) : at::zeros_like(w, at::kCPU);
      });
    });
  } else {
    at::NoGradGuard no_grad;
    const at::Tensor hidden = lm.forwardHidden(ids, /*training=*/false, segments);
    tensors["logits"] = lm.logits(hidden).to(at::kCPU);
    if (has_labels) tensors["loss"] = lm.loss(hidden, labels).to(at::kCPU);
  }
  for (auto& [name, t] : tensors) t = t.to(at::kFloat);
  writeTensorFile(out, tensors);
}

}  // namespace tandem::model
