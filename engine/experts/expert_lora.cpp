#include "engine/experts/expert_lora.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/error.h"

namespace tandem::experts {

namespace {
// splitmix64: a tiny, fully specified generator, so an init is reproducible everywhere
// (std::uniform_real_distribution is implementation-defined).
uint64_t splitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float uniform01(uint64_t& state) {
  return static_cast<float>(splitMix64(state) >> 40) * (1.0f / 16777216.0f);  // 24 bits
}
}  // namespace

ExpertLora::ExpertLora(const ExpertLayerSpec& layer, const ExpertLoraSpec& lora)
    : layer_(layer), spec_(lora) {
  if (spec_.rank < 0) throw Error("expert LoRA rank must not be negative");
  uint64_t bytes = 0;
  for (int p = 0; p < kExpertProjCount; ++p) {
    const auto proj = static_cast<ExpertProj>(p);
    if (!targets(proj)) continue;
    Slot& s = slot(proj);
    const auto a_total = static_cast<size_t>(layer_.num_experts * aSize(proj));
    const auto b_total = static_cast<size_t>(layer_.num_experts * bSize(proj));
    s.a.assign(a_total, 0.0f);
    s.grad_a.assign(a_total, 0.0f);
    s.b.assign(b_total, 0.0f);
    s.grad_b.assign(b_total, 0.0f);
    bytes += 2 * (a_total + b_total) * sizeof(float);
  }
  charge_ = MemoryCharge(MemoryLedger::global(), "cpu", MemoryCategory::Lora, bytes);
}

bool ExpertLora::targets(ExpertProj proj) const {
  if (spec_.rank <= 0) return false;
  switch (proj) {
    case ExpertProj::Gate: return spec_.gate;
    case ExpertProj::Up: return spec_.up;
    case ExpertProj::Down: return spec_.down;
  }
  return false;
}

int64_t ExpertLora::inFeatures(ExpertProj proj) const {
  return proj == ExpertProj::Down ? layer_.intermediate : layer_.hidden;
}

int64_t ExpertLora::outFeatures(ExpertProj proj) const {
  return proj == ExpertProj::Down ? layer_.hidden : layer_.intermediate;
}

void ExpertLora::check(ExpertProj proj, int64_t expert) const {
  if (!targets(proj)) {
    throw Error("expert LoRA does not target " + std::string(expertProjName(proj)),
                "add it to the LoRA target modules, or do not ask for its weights");
  }
  if (expert < 0 || expert >= layer_.num_experts) {
    throw Error("expert " + std::to_string(expert) + " is out of range [0, " +
                std::to_string(layer_.num_experts) + ")");
  }
}

std::span<float> ExpertLora::view(std::vector<float>& buffer, int64_t size, ExpertProj proj,
                                  int64_t expert) const {
  check(proj, expert);
  return std::span<float>(buffer).subspan(expert * size, size);
}

std::span<float> ExpertLora::a(ExpertProj p, int64_t e) { return view(slot(p).a, aSize(p), p, e); }
std::span<float> ExpertLora::b(ExpertProj p, int64_t e) { return view(slot(p).b, bSize(p), p, e); }
std::span<float> ExpertLora::gradA(ExpertProj p, int64_t e) {
  return view(slot(p).grad_a, aSize(p), p, e);
}
std::span<float> ExpertLora::gradB(ExpertProj p, int64_t e) {
  return view(slot(p).grad_b, bSize(p), p, e);
}
// The const overloads reuse the mutable ones: the buffers are ours, only constness is added.
std::span<const float> ExpertLora::a(ExpertProj p, int64_t e) const {
  return const_cast<ExpertLora*>(this)->a(p, e);
}
std::span<const float> ExpertLora::b(ExpertProj p, int64_t e) const {
  return const_cast<ExpertLora*>(this)->b(p, e);
}
std::span<const float> ExpertLora::gradA(ExpertProj p, int64_t e) const {
  return const_cast<ExpertLora*>(this)->gradA(p, e);
}
std::span<const float> ExpertLora::gradB(ExpertProj p, int64_t e) const {
  return const_cast<ExpertLora*>(this)->gradB(p, e);
}

void ExpertLora::zeroGrad() {
  for (Slot& s : slots_) {
    std::fill(s.grad_a.begin(), s.grad_a.end(), 0.0f);
    std::fill(s.grad_b.begin(), s.grad_b.end(), 0.0f);
  }
}

void ExpertLora::initPeft(uint64_t seed) {
  for (int p = 0; p < kExpertProjCount; ++p) {
    const auto proj = static_cast<ExpertProj>(p);
    if (!targets(proj)) continue;
    // kaiming_uniform_(a = sqrt(5)) on [r, in]: gain = sqrt(2 / (1 + 5)), bound =
    // gain · sqrt(3 / fan_in) = 1 / sqrt(in) (what torch.nn.Linear and PEFT use).
    const float bound = 1.0f / std::sqrt(static_cast<float>(inFeatures(proj)));
    for (int64_t e = 0; e < layer_.num_experts; ++e) {
      uint64_t state = seed ^ (0x5851f42d4c957f2dull * static_cast<uint64_t>(e * 3 + p + 1));
      for (float& value : a(proj, e)) value = (2.0f * uniform01(state) - 1.0f) * bound;
      std::span<float> b_span = b(proj, e);
      std::fill(b_span.begin(), b_span.end(), 0.0f);
    }
  }
}

void ExpertLora::loadExpert(ExpertProj proj, int64_t expert, const float* a_in, const float* b_in) {
  std::span<float> a_span = a(proj, expert), b_span = b(proj, expert);
  std::copy(a_in, a_in + a_span.size(), a_span.begin());
  std::copy(b_in, b_in + b_span.size(), b_span.begin());
}

void ExpertLora::storeExpert(ExpertProj proj, int64_t expert, float* a_out, float* b_out) const {
  std::span<const float> a_span = a(proj, expert), b_span = b(proj, expert);
  std::copy(a_span.begin(), a_span.end(), a_out);
  std::copy(b_span.begin(), b_span.end(), b_out);
}

}  // namespace tandem::experts
