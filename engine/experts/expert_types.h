#pragma once
// Plain value types shared by the expert engine's public API and its kernels. No libtorch here:
// the MoE autograd node (engine/gpu) hands raw pointers to ExpertLayer.

#include <cstdint>
#include <string_view>
#include <vector>

namespace tandem::experts {

// Shape of one routed-experts block (HF names: num_experts, hidden_size, moe_intermediate_size).
struct ExpertLayerSpec {
  int64_t num_experts = 0;
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
};

// PEFT LoRA on the experts' projections. scale is applied as given (alpha / r, or
// alpha / sqrt(r) for rsLoRA: the caller decides).
struct ExpertLoraSpec {
  int rank = 0;
  float scale = 0.0f;
  bool gate = false, up = false, down = false;

  bool any() const { return rank > 0 && (gate || up || down); }
};

// Activations crossing the API: x, y, dy, dx. BF16 is raw uint16 bits.
enum class ActivationType { F32, BF16 };
// Frozen base weights as stored in the checkpoint (raw bits for BF16 / F16).
enum class WeightType { F32, BF16, F16 };

std::string_view activationTypeName(ActivationType type);
std::string_view weightTypeName(WeightType type);
int64_t activationTypeBytes(ActivationType type);
int64_t weightTypeBytes(WeightType type);

// The three projections of a SiLU-gated expert; the order indexes per-projection arrays.
enum class ExpertProj { Gate = 0, Up = 1, Down = 2 };
inline constexpr int kExpertProjCount = 3;
std::string_view expertProjName(ExpertProj proj);

// Per-expert views of the frozen weights, e.g. into memory-mapped safetensors. Pointers need
// only be aligned to their element size's smallest unit (2 bytes); experts need not be adjacent.
//   gate[e], up[e]: [I, H] row-major;  down[e]: [H, I] row-major.
struct ExpertWeightViews {
  WeightType type = WeightType::BF16;
  std::vector<const void*> gate, up, down;
};

}  // namespace tandem::experts
