#include "engine/experts/expert_types.h"

#include <string>

#include "engine/core/error.h"

namespace tandem::experts {

std::string_view activationTypeName(ActivationType type) {
  return type == ActivationType::F32 ? "f32" : "bf16";
}

std::string_view weightTypeName(WeightType type) {
  switch (type) {
    case WeightType::F32: return "f32";
    case WeightType::BF16: return "bf16";
    case WeightType::F16: return "f16";
    case WeightType::FP8_E4M3: return "fp8_e4m3";
    case WeightType::Q8_0: return "q8_0";
    case WeightType::Q4_0: return "q4_0";
    case WeightType::Q4_K: return "q4_k";
    case WeightType::Q5_K: return "q5_k";
    case WeightType::Q6_K: return "q6_k";
    case WeightType::IQ4_XS: return "iq4_xs";
    case WeightType::MXFP4: return "mxfp4";
    case WeightType::INT4: return "int4";
  }
  return "?";
}

std::string_view weightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::Bf16: return "bf16";
    case WeightFormat::Int8: return "int8";
    case WeightFormat::Int4: return "int4";
    case WeightFormat::Blocks: return "blocks";
  }
  return "?";
}

std::string_view wtPolicyName(WtPolicy policy) {
  switch (policy) {
    case WtPolicy::Persistent: return "persistent";
    case WtPolicy::OnDemand: return "on_demand";
    case WtPolicy::Background: return "background";
  }
  return "?";
}

std::string int4FormatName(const Int4Spec& spec) {
  std::string name = "int4";
  if (spec.group != 32) name += ":g" + std::to_string(spec.group);
  if (!spec.symmetric) name += ":asym";
  return name;
}

namespace {
// "int4" then ":gN" / ":asym" / ":sym" options.
bool parseInt4(std::string_view name, Int4Spec& spec) {
  if (name.substr(0, 4) != "int4") return false;
  std::string_view rest = name.substr(4);
  while (!rest.empty()) {
    if (rest[0] != ':') return false;
    rest.remove_prefix(1);
    const std::string_view option = rest.substr(0, rest.find(':'));
    rest.remove_prefix(option.size());
    if (option == "asym") {
      spec.symmetric = false;
    } else if (option == "sym") {
      spec.symmetric = true;
    } else if (option == "g32" || option == "g64" || option == "g128") {
      spec.group = std::stoi(std::string(option.substr(1)));
    } else {
      return false;
    }
  }
  return true;
}
}  // namespace

WeightFormat parseWeightFormat(std::string_view name, Int4Spec* int4) {
  Int4Spec spec;
  if (parseInt4(name, spec)) {
    if (int4) *int4 = spec;
    return WeightFormat::Int4;
  }
  if (name == "bf16") return WeightFormat::Bf16;
  if (name == "int8") return WeightFormat::Int8;
  if (name == "int4") return WeightFormat::Int4;
  if (name == "blocks") return WeightFormat::Blocks;
  throw Error("unknown expert weight format '" + std::string(name) + "'",
              "use bf16, int8, int4 (group 32, 64 or 128: int4:g64, int4:asym) or blocks (fp8 "
              "checkpoints are read directly and packed to bf16 or int8; blocks keeps a GGUF "
              "file's quantised experts as they are)");
}

WtPolicy parseWtPolicy(std::string_view name) {
  if (name == "persistent") return WtPolicy::Persistent;
  if (name == "on_demand") return WtPolicy::OnDemand;
  if (name == "background") return WtPolicy::Background;
  throw Error("unknown backward weight policy '" + std::string(name) + "'",
              "use persistent, on_demand or background");
}

std::string_view taskSplitName(TaskSplit split) {
  switch (split) {
    case TaskSplit::Auto: return "auto";
    case TaskSplit::Rows: return "rows";
    case TaskSplit::Columns: return "columns";
  }
  return "?";
}

TaskSplit parseTaskSplit(std::string_view name) {
  if (name == "auto") return TaskSplit::Auto;
  if (name == "rows") return TaskSplit::Rows;
  if (name == "columns") return TaskSplit::Columns;
  throw Error("unknown expert task split '" + std::string(name) + "'", "use auto, rows or columns");
}

int64_t activationTypeBytes(ActivationType type) { return type == ActivationType::F32 ? 4 : 2; }

int64_t weightTypeBytes(WeightType type) {
  switch (type) {
    case WeightType::F32: return 4;
    case WeightType::BF16:
    case WeightType::F16: return 2;
    case WeightType::FP8_E4M3: return 1;
    default: return 0;  // block types: expert_blocks.h
  }
}

std::string_view expertProjName(ExpertProj proj) {
  switch (proj) {
    case ExpertProj::Gate: return "gate_proj";
    case ExpertProj::Up: return "up_proj";
    case ExpertProj::Down: return "down_proj";
  }
  return "?";
}

}  // namespace tandem::experts
