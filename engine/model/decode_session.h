#pragma once
// A KV-cached decode of one sequence on a Model, without libtorch in sight: feed the prompt
// (the prefill), then each new token; every feed returns the logits of the last position. The
// cache is preallocated for `capacity` positions; autograd is off for the session's work.
// Generation (engine/infer) picks the tokens. One-token feeds after the prompt of a bf16 model
// on the CPU take CpuDecodeStep (decode_session_cpu.h: the same step without libtorch's per-op
// dispatch); everything else CausalLm::forwardCached.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace tandem::model {

class CpuDecodeStep;
class KvCache;
class Model;

// Which code runs a one-token feed: CpuDecodeStep where it takes the model (the product's
// choice), or always CausalLm::forwardCached (`tandem debug decode --step libtorch`: the
// reference the fast step is compared against, tests/parity/test_decode_step_reference.py).
enum class DecodeStepPath { Auto, Libtorch };

class DecodeSession {
 public:
  DecodeSession(const Model& model, int64_t capacity, DecodeStepPath path = DecodeStepPath::Auto);
  ~DecodeSession();
  DecodeSession(const DecodeSession&) = delete;
  DecodeSession& operator=(const DecodeSession&) = delete;

  // ids: the next positions' tokens (non-empty; the prompt, then one at a time) -> the logits of
  // the last of them, [vocab] fp32. Throws Error past the capacity or on ids outside the
  // vocabulary, OutOfMemory (core/error.h) when a device or the host runs out.
  std::vector<float> feed(std::span<const int32_t> ids);

  int64_t length() const;  // positions fed so far

 private:
  const Model& model_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<CpuDecodeStep> cpu_step_;  // null when the model is not one it takes
};

}  // namespace tandem::model
