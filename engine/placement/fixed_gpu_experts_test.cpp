// Resident expert counts fixed per layer (the studio's placement board, a rule file's
// tandem_gpu_experts): they survive a rule file's write and read, and the planner evaluates them
// as given while it still fills the layers whose counts are its own.

#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/placement/kt_rules.h"
#include "engine/placement/memory_planner.h"

namespace tandem::placement {
namespace {

namespace fs = std::filesystem;
const fs::path kPresets = fs::path(TANDEM_PRESETS_DIR);

PlanRequest qwen3() {
  PlanRequest r;
  r.model = io::readModelConfig(kPresets / "models" / "qwen3-30b-a3b.json");
  r.cutoff_len = 2048;
  return r;
}

ModulePlacement& experts(Placement& p, int layer) {
  return *p.find("model.layers." + std::to_string(layer) + ".mlp.experts");
}

TEST(FixedGpuExperts, RuleFileCarriesThem) {
  const PlanRequest request = qwen3();
  const Hardware hw = resolveHardware("2x4090-24g_xeon-spr-2s_512g", kPresets / "hardware");
  Placement p = planMemory(request, hw).placement;
  for (int layer = 0; layer < request.model.num_hidden_layers; ++layer) {
    experts(p, layer).gpu_experts = layer % 3 == 0 ? 7 : 2;
    experts(p, layer).gpu_experts_fixed = true;
  }
  experts(p, 4).gpu_experts = 0;  // a fixed 0: none, where auto would fill
  const std::string yaml = writeKtRules(p, request.model);
  EXPECT_NE(yaml.find("tandem_gpu_experts: 7"), std::string::npos) << yaml;
  EXPECT_EQ(applyKtRules(parseKtRules(yaml, "board.yaml"), request.model), p);
}

TEST(FixedGpuExperts, TheirCountsAreCheckedAsTheyAreRead) {
  const io::ModelConfig model = qwen3().model;
  for (const char* count : {"129", "-1", "many"}) {
    const std::string yaml =
        std::string(
            "- match: {name: \"^model\\\\.layers\\\\.0\\\\.mlp\\\\.experts$\"}\n"
            "  replace:\n"
            "    class: ktransformers.operators.experts.KTransformersExperts\n"
            "    kwargs: {generate_device: cpu, tandem_gpu_experts: \"") +
        count + "\"}\n";
    try {
      applyKtRules(parseKtRules(yaml, "rules.yaml"), model);
      ADD_FAILURE() << count << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("tandem_gpu_experts '" + std::string(count) + "'"),
                std::string::npos)
          << e.message();
      EXPECT_NE(e.whatToDo().find("0 to 128"), std::string::npos) << e.whatToDo();
    }
  }
}

TEST(FixedGpuExperts, ThePlannerKeepsThemAndFillsTheRest) {
  const PlanRequest request = qwen3();  // gpu_experts auto
  const Hardware hw = resolveHardware("1x4090-24g_xeon-w7-spr_256g", kPresets / "hardware");
  const MemoryPlan planned = planMemory(request, hw);
  const int64_t auto_count = experts(const_cast<Placement&>(planned.placement), 0).gpu_experts;
  ASSERT_GT(auto_count, 4);
  Placement p = planned.placement;
  experts(p, 0).gpu_experts = 1;
  experts(p, 0).gpu_experts_fixed = true;
  experts(p, 1).gpu_experts = 0;
  experts(p, 1).gpu_experts_fixed = true;
  const MemoryPlan plan = evaluatePlacement(request, hw, p);
  Placement& got = const_cast<Placement&>(plan.placement);
  EXPECT_EQ(experts(got, 0).gpu_experts, 1);
  EXPECT_EQ(experts(got, 1).gpu_experts, 0);
  // The other 46 layers share what the two gave back: at least as many as before each.
  EXPECT_GE(experts(got, 2).gpu_experts, auto_count);
  EXPECT_FALSE(experts(got, 2).gpu_experts_fixed);
  // Resident bytes on the GPU are the counts' sum times one expert's bf16 bytes.
  uint64_t resident = 0;
  for (const PlanItem& item : plan.device(Device::cuda(0))->items)
    resident += item.what == "resident routed experts" ? item.bytes : 0;
  const auto per_expert = uint64_t{3} * 2048 * 768 * 2;
  EXPECT_EQ(resident,
            (1 + 0 + 46 * static_cast<uint64_t>(experts(got, 2).gpu_experts)) * per_expert);
}

}  // namespace
}  // namespace tandem::placement
