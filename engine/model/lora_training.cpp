#include "engine/model/lora_training.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <map>
#include <string>

#include "engine/core/error.h"
#include "engine/gpu/segmented_attention.h"
#include "engine/model/causal_lm.h"
#include "engine/model/lora_optimizer.h"
#include "engine/model/model.h"
#include "engine/model/process_group_tensors.h"
#include "engine/model/weight_loader.h"

namespace tandem::model {

namespace {

// The dropout generator's entry in the state file.
const char* const kDropoutRngKey = "rng.cpu";

// [rows, width] int64 CPU tensors over the batch's own vectors (no copy; the caller keeps them).
at::Tensor rowsOf(const TokenBatch& batch, const std::vector<int64_t>& values) {
  if (batch.rows <= 0 || batch.width <= 0 ||
      values.size() != static_cast<size_t>(batch.rows * batch.width)) {
    throw Error("a token batch of " + std::to_string(values.size()) + " ids is not " +
                std::to_string(batch.rows) + " rows of " + std::to_string(batch.width));
  }
  return at::from_blob(const_cast<int64_t*>(values.data()), {batch.rows, batch.width}, at::kLong);
}

// The batch's packed samples as the model takes them; null when its rows are not neat-packed.
std::unique_ptr<gpu::SequenceSegments> segmentsOf(const TokenBatch& batch) {
  if (batch.segment_lengths.empty()) return nullptr;
  auto segments = std::make_unique<gpu::SequenceSegments>();
  segments->lengths = batch.segment_lengths;
  return segments;
}

[[noreturn]] void rethrowOutOfMemory(const c10::OutOfMemoryError& e) {
  const std::string what = e.what_without_backtrace();
  throw OutOfMemory(what.substr(0, what.find('\n')));
}

// Host memory running out mid-step: the expert engine's buffers (std::bad_alloc) or libtorch's
// CPU allocator ("DefaultCPUAllocator: not enough memory"), as an OutOfMemory like the GPU's, so
// the trainer saves the last step and says what fits. Other errors go on as they are.
[[noreturn]] void rethrowHostOutOfMemory(const std::string& what) {
  throw OutOfMemory("host out of memory: " + what.substr(0, what.find('\n')));
}
bool isHostOutOfMemory(const c10::Error& e) {
  return std::string(e.what_without_backtrace()).find("not enough memory") != std::string::npos;
}

}  // namespace

LoraTraining::LoraTraining(Model& model, const AdamWSettings& adamw, ThreadPool& pool)
    : model_(model), optimizer_(std::make_unique<LoraOptimizer>(model.lm(), adamw, pool)) {}

LoraTraining::~LoraTraining() = default;

void LoraTraining::seedDropout(uint64_t seed) { at::manual_seed(seed); }

double LoraTraining::accumulateGradients(const TokenBatch& batch, double weight) {
  const at::Tensor ids = rowsOf(batch, batch.input_ids);
  const at::Tensor labels = rowsOf(batch, batch.labels);
  const std::unique_ptr<gpu::SequenceSegments> segments = segmentsOf(batch);
  try {
    const at::Tensor hidden = model_.lm().forwardHidden(ids, /*training=*/true, segments.get());
    const at::Tensor loss = model_.lm().loss(hidden, labels) * weight;
    torch::autograd::backward({loss});
    return loss.item<double>();
  } catch (const c10::OutOfMemoryError& e) {
    rethrowOutOfMemory(e);
  } catch (const std::bad_alloc& e) {
    rethrowHostOutOfMemory(e.what());
  } catch (const c10::Error& e) {
    if (isHostOutOfMemory(e)) rethrowHostOutOfMemory(e.what_without_backtrace());
    throw;
  }
}

double LoraTraining::evaluateLoss(const TokenBatch& batch) {
  at::NoGradGuard no_grad;
  const at::Tensor ids = rowsOf(batch, batch.input_ids);
  const at::Tensor labels = rowsOf(batch, batch.labels);
  const std::unique_ptr<gpu::SequenceSegments> segments = segmentsOf(batch);
  try {
    const at::Tensor hidden = model_.lm().forwardHidden(ids, /*training=*/false, segments.get());
    return model_.lm().loss(hidden, labels).item<double>();
  } catch (const c10::OutOfMemoryError& e) {
    rethrowOutOfMemory(e);
  }
}

void LoraTraining::allReduceGradients(ProcessGroup& group, const std::string& what) {
  at::NoGradGuard no_grad;
  allReduceSumTensors(group, optimizer_->gradientTensors(), what);
}

double LoraTraining::clipGradNorm(double max_norm) { return optimizer_->clipGradNorm(max_norm); }
void LoraTraining::step(double lr) { optimizer_->step(lr); }
void LoraTraining::zeroGrad() { optimizer_->zeroGrad(); }
int64_t LoraTraining::stepCount() const { return optimizer_->stepCount(); }

void LoraTraining::saveState(const std::filesystem::path& file) const {
  std::map<std::string, at::Tensor> state = optimizer_->stateDict();
  state[kDropoutRngKey] = at::detail::getDefaultCPUGenerator().get_state();
  writeTensorFile(file, state, {});
}

void LoraTraining::loadState(const std::filesystem::path& file, int64_t step_count) {
  const std::map<std::string, at::Tensor> tensors = readTensorFile(file);
  const auto rng = tensors.find(kDropoutRngKey);
  if (rng == tensors.end()) {
    throw Error(file.string() + " holds no dropout generator state", "delete that checkpoint dir");
  }
  optimizer_->loadStateDict(tensors, step_count);
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(rng->second);
}

}  // namespace tandem::model
