#pragma once
// One decode step of a bf16 model on the CPU without libtorch's per-op dispatch: the token's
// embedding, every layer's norms, rope, attention over the KV cache, the router's top-k and the
// final norm are plain C++ loops over a handful of fp32 buffers allocated once; the projections go
// straight to their few-row block kernels (stored_block_linear.h: a GGUF's Q4_K / Q6_K weights)
// and the routed experts straight to the CPU expert engine. On a small model a step of libtorch
// ops spent ~30 % of its time in dispatch and small allocations (docs/benchmarks.md, "Decode vs
// llama.cpp"); this path spends it in the kernels.
//
// It computes what CausalLm::forwardCached computes for one token, with the residual stream and
// everything between the kernels in fp32 (as llama.cpp does) where libtorch rounds each op's
// result to bf16: logits agree within bf16 noise, not bitwise (decode_session_cpu_test.cpp).
// A part it has no plain form for runs through its libtorch module on a tensor made from the
// buffer: a projection with a LoRA adapter or without a few-row kernel, an MoE block with offload,
// split, resident or LoRA experts, or a router other than Qwen's / Mixtral's softmax top-k.
// Models it does not take at all (create returns null; DecodeSession keeps forwardCached): not
// bf16, any part off the CPU, MLA attention, rotary dims other than the head's.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::model {

class CausalLm;
class KvCache;

class CpuDecodeStep {
 public:
  // The step for `lm`, or null when the model is not one it takes (`why_not`, when given, says
  // why). Holds pointers into lm's weights: lm must outlive it, and its adapters must not change
  // while it lives (as for a KvCache).
  static std::unique_ptr<CpuDecodeStep> create(const CausalLm& lm, std::string* why_not = nullptr);
  ~CpuDecodeStep();
  CpuDecodeStep(const CpuDecodeStep&) = delete;
  CpuDecodeStep& operator=(const CpuDecodeStep&) = delete;

  // Whether step() can continue `cache` now: batch 1, a prompt already in it (forwardCached's
  // prefill allocated its K/V), room for one more position.
  bool takes(KvCache& cache) const;
  // `token` at position cache.length(): writes its keys and values into the cache, advances it by
  // one, and returns the logits of the position, [vocab] fp32. Error on a token outside the
  // vocabulary or a cache takes() refuses. Not thread-safe (one sequence at a time).
  std::vector<float> step(int32_t token, KvCache& cache);

 private:
  struct Plan;
  explicit CpuDecodeStep(std::unique_ptr<Plan> plan);
  std::unique_ptr<Plan> plan_;
};

}  // namespace tandem::model
