#include "engine/experts/expert_types.h"

namespace tandem::experts {

std::string_view activationTypeName(ActivationType type) {
  return type == ActivationType::F32 ? "f32" : "bf16";
}

std::string_view weightTypeName(WeightType type) {
  switch (type) {
    case WeightType::F32: return "f32";
    case WeightType::BF16: return "bf16";
    case WeightType::F16: return "f16";
  }
  return "?";
}

int64_t activationTypeBytes(ActivationType type) { return type == ActivationType::F32 ? 4 : 2; }

int64_t weightTypeBytes(WeightType type) { return type == WeightType::F32 ? 4 : 2; }

std::string_view expertProjName(ExpertProj proj) {
  switch (proj) {
    case ExpertProj::Gate: return "gate_proj";
    case ExpertProj::Up: return "up_proj";
    case ExpertProj::Down: return "down_proj";
  }
  return "?";
}

}  // namespace tandem::experts
