#pragma once
// A LoRA adapter's hyperparameters, as LLaMA-Factory and PEFT name them (lora_rank, lora_alpha,
// use_rslora, lora_dropout). No libtorch: training and generation pass them without the model.

namespace tandem::gpu {

struct LoraSettings {
  int rank = 0;
  double alpha = 0;
  bool rslora = false;  // scale = alpha / sqrt(r) instead of alpha / r
  double dropout = 0;

  double scale() const;
};

}  // namespace tandem::gpu
