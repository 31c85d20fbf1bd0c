#pragma once
// LoRA Experts (LE, issue 32; KT-FT's "LoRA Expert"): per MoE layer, a small trainable SwiGLU
// path on the layer's device that every token goes through, added to the MoE block's output
// after the routed and shared experts are combined:
//   LE(x) = Σ_k down_k(silu(gate_k(x)) ⊙ up_k(x))     (k over lora_experts paths)
// gate_k, up_k [le_dim, hidden] and down_k [hidden, le_dim] are fp32 autograd leaves, like LoRA's
// A and B. down starts at zero, so a fresh LE adds exactly 0 (step 0 equals the model without
// it); gate and up start as PEFT's lora_A does (kaiming_uniform(a=√5) = U(±1/√hidden)), so the
// path learns as soon as down moves. As a LoRA branch, it runs in fp32 and the block adds it to
// its output in fp32 before casting back to the model dtype. K paths of le_dim equal one path of
// K·le_dim (the sum over k is a concatenation), so "several paths" is a way to size LE, not a
// different function. docs/peft_formats.md has the saved form (lora_experts.safetensors +
// lora_experts_config.json).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tandem::model {

// Names of one path's projections as saved: "<mlp>.lora_experts.<k>.<proj>.weight".
inline constexpr const char* kLoraExpertProjNames[] = {"gate_proj", "up_proj", "down_proj"};

struct LoraExpertPath {
  at::Tensor gate;  // [le_dim, hidden] fp32
  at::Tensor up;    // [le_dim, hidden] fp32
  at::Tensor down;  // [hidden, le_dim] fp32
  at::Tensor& proj(int p) { return p == 0 ? gate : p == 1 ? up : down; }
  const at::Tensor& proj(int p) const { return p == 0 ? gate : p == 1 ? up : down; }
};

class LoraExperts {
 public:
  LoraExperts() = default;
  // `count` paths of intermediate `le_dim` for a block of width `hidden`, on `device`; the same
  // seed gives the same gate and up.
  static LoraExperts fresh(int64_t count, int64_t le_dim, int64_t hidden, at::Device device,
                           uint64_t seed);
  // Saved weights (any dtype and device) as fp32 leaves on `device`.
  static LoraExperts fromPaths(const std::vector<LoraExpertPath>& paths, at::Device device);

  bool defined() const { return !paths_.empty(); }
  int64_t count() const { return static_cast<int64_t>(paths_.size()); }
  int64_t dim() const;  // le_dim

  // tokens [T, hidden] in the model dtype -> LE(tokens) [T, hidden] fp32.
  at::Tensor forward(const at::Tensor& tokens) const;

  // Every trainable tensor with its module-style name: "<mlp>.lora_experts.<k>.<proj>.weight".
  void visitWeights(const std::string& mlp,
                    const std::function<void(const std::string& name, at::Tensor& weight)>& visit);
  const std::vector<LoraExpertPath>& paths() const { return paths_; }

 private:
  std::vector<LoraExpertPath> paths_;
};

// Parameters of one path: gate, up and down.
inline int64_t loraExpertPathParameters(int64_t hidden, int64_t le_dim) {
  return 3 * hidden * le_dim;
}

}  // namespace tandem::model
