#pragma once
// ExpertLora: the fp32 master weights and gradients of LoRA on every expert's gate/up/down.
//
// Per targeted projection P (in → out features; gate/up: H → I, down: I → H):
//   A [E, r, in], B [E, out, r], grad A, grad B: each one contiguous fp32 buffer over all
//   experts, so the fused CPU AdamW and the global grad-norm run over a handful of flat spans.
// PEFT semantics: P(x) = x W_Pᵀ + scale · (x A_Pᵀ) B_Pᵀ. Gradients accumulate (+=) across
// backward calls until zeroGrad(). Memory is charged to MemoryLedger::global() ("cpu", Lora).

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/memory_ledger.h"
#include "engine/experts/expert_types.h"

namespace tandem::experts {

class ExpertLora {
 public:
  // Zero-initialised buffers for the projections `lora` targets (none when lora.rank == 0).
  ExpertLora(const ExpertLayerSpec& layer, const ExpertLoraSpec& lora);
  ExpertLora(ExpertLora&&) noexcept = default;
  ExpertLora& operator=(ExpertLora&&) noexcept = default;
  ExpertLora(const ExpertLora&) = delete;
  ExpertLora& operator=(const ExpertLora&) = delete;

  const ExpertLoraSpec& spec() const { return spec_; }
  int rank() const { return spec_.rank; }
  float scale() const { return spec_.scale; }
  bool targets(ExpertProj proj) const;
  int64_t numExperts() const { return layer_.num_experts; }
  int64_t inFeatures(ExpertProj proj) const;
  int64_t outFeatures(ExpertProj proj) const;

  // One expert's matrices: a [r, in], b [out, r] fp32 row-major. Error if proj is not targeted
  // or expert is out of range.
  std::span<float> a(ExpertProj proj, int64_t expert);
  std::span<float> b(ExpertProj proj, int64_t expert);
  std::span<float> gradA(ExpertProj proj, int64_t expert);
  std::span<float> gradB(ExpertProj proj, int64_t expert);
  std::span<const float> a(ExpertProj proj, int64_t expert) const;
  std::span<const float> b(ExpertProj proj, int64_t expert) const;
  std::span<const float> gradA(ExpertProj proj, int64_t expert) const;
  std::span<const float> gradB(ExpertProj proj, int64_t expert) const;

  // Whole buffers, [E, r, in] / [E, out, r] (empty when proj is not targeted): for optimizers.
  std::span<float> allA(ExpertProj proj) { return slot(proj).a; }
  std::span<float> allB(ExpertProj proj) { return slot(proj).b; }
  std::span<float> allGradA(ExpertProj proj) { return slot(proj).grad_a; }
  std::span<float> allGradB(ExpertProj proj) { return slot(proj).grad_b; }

  void zeroGrad();

  // PEFT's default init: A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0.
  // Deterministic in (seed, projection, expert), independent of thread count and platform.
  void initPeft(uint64_t seed);

  // Copy one expert's a [r, in] and b [out, r] fp32 row-major in / out (e.g. adapter files).
  void loadExpert(ExpertProj proj, int64_t expert, const float* a_in, const float* b_in);
  void storeExpert(ExpertProj proj, int64_t expert, float* a_out, float* b_out) const;

 private:
  struct Slot {
    std::vector<float> a, b, grad_a, grad_b;
  };
  Slot& slot(ExpertProj proj) { return slots_[static_cast<int>(proj)]; }
  const Slot& slot(ExpertProj proj) const { return slots_[static_cast<int>(proj)]; }
  void check(ExpertProj proj, int64_t expert) const;  // throws Error
  std::span<float> view(std::vector<float>& buffer, int64_t size, ExpertProj proj,
                        int64_t expert) const;
  int64_t aSize(ExpertProj proj) const { return int64_t{spec_.rank} * inFeatures(proj); }
  int64_t bSize(ExpertProj proj) const { return int64_t{spec_.rank} * outFeatures(proj); }

  ExpertLayerSpec layer_;
  ExpertLoraSpec spec_;
  Slot slots_[kExpertProjCount];
  MemoryCharge charge_;
};

}  // namespace tandem::experts
