#pragma once
// LoRA training steps on a Model, without libtorch in sight: token batches in, forward and
// backward, one global grad-norm clip, AdamW over every LoRA weight (the torch-side adapters on
// their devices, the routed experts' in the expert engine's buffers: lora_optimizer.h), and the
// optimizer state of a checkpoint. The trainer (engine/train) owns the loop around it: data
// order, accumulation windows, schedule, logging, checkpoint dirs.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace tandem {
class ThreadPool;
}

namespace tandem::model {

class Model;
class LoraOptimizer;
class ProcessGroup;

struct AdamWSettings {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Token rows, right-padded: [rows, width] row-major.
struct TokenBatch {
  int64_t rows = 0;
  int64_t width = 0;
  std::vector<int64_t> input_ids;  // [rows * width]; the pad id past a row's end
  std::vector<int64_t> labels;     // [rows * width]; -100 where there is no loss
  // Neat packing (LLaMA-Factory's neat_packing): [rows][samples in the row], the token count of
  // each sample packed into the row, in order; the samples do not attend to each other and their
  // positions restart at 0. Empty: each row is one causal sequence (plain packing too).
  std::vector<std::vector<int64_t>> segment_lengths;
};

class LoraTraining {
 public:
  // Collects every LoRA weight of `model` (an Error when it has none).
  LoraTraining(Model& model, const AdamWSettings& adamw, ThreadPool& pool);
  ~LoraTraining();
  LoraTraining(const LoraTraining&) = delete;
  LoraTraining& operator=(const LoraTraining&) = delete;

  // Seeds the generator the LoRA dropout masks come from (part of the optimizer state below).
  static void seedDropout(uint64_t seed);

  // Forward and backward of one micro-batch: its loss (the mean over its kept tokens, as
  // transformers computes it) times `weight` is backpropagated into the LoRA gradients, which
  // accumulate until zeroGrad. Returns that weighted loss. Throws OutOfMemory (core/error.h).
  double accumulateGradients(const TokenBatch& batch, double weight);
  // The mean loss over the batch's kept tokens, without gradients (NaN when none is kept).
  double evaluateLoss(const TokenBatch& batch);

  // The global L2 norm of all LoRA gradients; scales them down to max_norm when above (and > 0).
  // Data parallel: sums every LoRA gradient over the ranks of `group` (before clipping).
  void allReduceGradients(ProcessGroup& group, const std::string& what);
  double clipGradNorm(double max_norm);
  void step(double lr);
  void zeroGrad();
  int64_t stepCount() const;

  // The AdamW moments and the dropout generator's state as one safetensors file; loadState
  // restores both into a model of the same LoRA layout, `step_count` steps taken.
  void saveState(const std::filesystem::path& file) const;
  void loadState(const std::filesystem::path& file, int64_t step_count);

 private:
  Model& model_;
  std::unique_ptr<LoraOptimizer> optimizer_;
};

}  // namespace tandem::model
