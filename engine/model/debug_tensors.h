#pragma once
// What `tandem debug forward|grad` writes for checking a model against transformers + peft (the
// parity tests): the logits of token rows, their loss against labels, and the gradient of every
// LoRA weight under PEFT's names, all fp32, in one safetensors file. No libtorch in here.

#include <filesystem>

#include "engine/model/lora_training.h"

namespace tandem::model {

class Model;

// batch.labels empty: logits only ("logits"); else also "loss". gradients: one forward and
// backward in training mode (dropout as configured) and every LoRA gradient (needs labels).
void writeDebugTensors(Model& model, const TokenBatch& batch, bool gradients,
                       const std::filesystem::path& out);

}  // namespace tandem::model
