#include "engine/placement/placement.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/placement/hardware.h"
#include "engine/placement/kt_rules.h"

namespace tandem::placement {
namespace {

namespace fs = std::filesystem;
const fs::path kPresets = fs::path(TANDEM_PRESETS_DIR);

io::ModelConfig model(const char* name) { return io::readModelConfig(kPresets / "models" / name); }

std::string errorOf(const std::string& yaml, const io::ModelConfig& m) {
  try {
    parsePlacementPreset(yaml, "p.yaml", m);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(Placement, ModulesFollowTheArchitecture) {
  const Placement v3 = modulesOf(model("deepseek-v3.json"));
  // embed + 3 dense layers (attention, mlp) + 58 MoE layers (attention, gate, shared, experts) +
  // norm + head
  EXPECT_EQ(v3.modules.size(), 1u + 3 * 2 + 58 * 4 + 2);
  EXPECT_EQ(v3.modules[1].name, "model.layers.0.self_attn");
  EXPECT_EQ(v3.modules[2].kind, ModuleKind::DenseMlp);
  EXPECT_NE(v3.find("model.layers.3.mlp.shared_experts"), nullptr);
  const Placement qwen = modulesOf(model("qwen3-30b-a3b.json"));
  EXPECT_EQ(qwen.find("model.layers.0.mlp.shared_experts"), nullptr);
  EXPECT_EQ(qwen.modules.size(), 1u + 48 * 3 + 2);
}

// A layer's device is its attention's, whatever its experts' device says.
TEST(Placement, LayerDevicesAreWhereTheAttentionIs) {
  Placement p = modulesOf(model("qwen3-30b-a3b.json"));
  for (ModulePlacement& m : p.modules) {
    m.device =
        m.kind == ModuleKind::RoutedExperts ? Device::cpu() : Device::cuda(m.layer >= 24 ? 1 : 0);
  }
  const std::vector<Device> devices = p.layerDevices();
  ASSERT_EQ(devices.size(), 48u);
  EXPECT_EQ(devices[0].str(), "cuda:0");
  EXPECT_EQ(devices[23].str(), "cuda:0");
  EXPECT_EQ(devices[24].str(), "cuda:1");
  EXPECT_EQ(devices[47].str(), "cuda:1");
}

TEST(Placement, EveryShippedPresetAppliesToEveryModel) {
  for (const auto& entry : fs::directory_iterator(kPresets / "placement")) {
    if (entry.path().extension() != ".yaml") continue;
    for (const char* m : {"deepseek-v3.json", "kimi-k2.json", "qwen3-30b-a3b.json",
                          "mixtral-8x7b.json", "deepseek-v2-lite.json", "qwen3-235b-a22b.json"}) {
      const io::ModelConfig config = model(m);
      if (entry.path().stem() == "deepseek-v3_2gpu_amx-int8" && config.num_hidden_layers <= 30)
        continue;
      SCOPED_TRACE(entry.path().string() + " / " + m);
      const Placement p = loadPlacementFile(entry.path(), config);
      const RuntimePlacement r = toRuntimePlacement(p);
      EXPECT_EQ(r.layer_devices.size(), static_cast<size_t>(config.num_hidden_layers));
      EXPECT_EQ(r.head_device, p.find("lm_head")->device);
    }
  }
}

TEST(Placement, PresetMatchesTheRuleFileItStandsFor) {
  const io::ModelConfig v3 = model("deepseek-v3.json");
  const Placement preset =
      loadPlacementFile(kPresets / "placement" / "deepseek-v3_2gpu_amx-int8.yaml", v3);
  const Placement rules = loadPlacementFile(
      fs::path(TANDEM_PLACEMENT_TESTDATA) / "DeepSeek-V3-Chat-sft-amx-multi-gpu.yaml", v3);
  EXPECT_EQ(preset, rules);
}

TEST(Placement, OffloadRunsExpertsOnTheirLayersGpu) {
  const Placement p = loadPlacementFile(kPresets / "placement" / "one-gpu_offload.yaml",
                                        model("deepseek-v2-lite.json"));
  const ModulePlacement* experts = p.find("model.layers.5.mlp.experts");
  ASSERT_NE(experts, nullptr);
  EXPECT_EQ(experts->device.str(), "cpu");
  EXPECT_EQ(experts->compute_device, Device::cuda(0));
  const RuntimePlacement r = toRuntimePlacement(p);
  EXPECT_EQ(r.experts_mode, "gpu-offload");
  EXPECT_EQ(r.experts_weight_format, "bf16");
}

TEST(Placement, PresetErrorsNameFileAndKey) {
  const io::ModelConfig qwen = model("qwen3-30b-a3b.json");
  const std::string head = "embed_tokens: cpu\nlm_head: cuda:0\nexperts: {backend: auto}\n";
  EXPECT_EQ(errorOf(head + "layers: [{layers: \"0-40\", device: cuda:0}]\n", qwen),
            "p.yaml: layer 41 has no device");
  EXPECT_EQ(errorOf(head + "layers: [{layers: \"0-48\", device: cuda:0}]\n", qwen),
            "p.yaml: layers[0]: layer 48 is past the model's last layer 47");
  EXPECT_EQ(errorOf(head + "layers: [{layers: \"5-2\", device: cuda:0}]\n", qwen),
            "p.yaml: layers[0]: '5-2' is not a layer range");
  EXPECT_EQ(errorOf(head + "layers: [{layers: \"0-\", device: gpu0}]\n", qwen),
            "p.yaml: layers[0].device: 'gpu0' is not a device");
  EXPECT_EQ(errorOf("embed_tokens: cpu\nlm_head: cuda:0\nexperts: {backend: amx_int4}\nlayers: "
                    "[{layers: \"0-\", device: cuda:0}]\n",
                    qwen),
            "p.yaml: model.layers.0.mlp.experts: 'amx_int4' is not an experts backend");
  EXPECT_EQ(errorOf(head + "layer: []\n", qwen), "p.yaml: unknown key 'layer'");
  // A key that is not text threw yaml-cpp's TypedBadConversion before.
  EXPECT_EQ(errorOf(head + "[layers]: []\n", qwen), "p.yaml has a key that is not a text value");
}

TEST(Placement, ValidationBoundsDevicesByTheMachine) {
  const io::ModelConfig qwen = model("qwen3-30b-a3b.json");
  Placement p = loadPlacementFile(kPresets / "placement" / "one-gpu_cpu-experts.yaml", qwen);
  auto machine = [](std::vector<int> gpus, std::vector<int> nodes) {
    Hardware hw;
    for (int g : gpus) hw.gpus.push_back({.index = g});
    for (int n : nodes) hw.numa_nodes.push_back({.id = n});
    return hw;
  };
  const Hardware gpu0 = machine({0}, {0}), gpu1 = machine({1}, {0}),
                 two_nodes = machine({0}, {0, 1});
  EXPECT_NO_THROW(validatePlacement(p, &gpu0));
  EXPECT_THROW(validatePlacement(p, &gpu1), Error);  // planned for cuda:1 alone: no cuda:0
  const Hardware no_gpu = machine({}, {0});
  EXPECT_THROW(validatePlacement(p, &no_gpu), Error);
  p.find("model.layers.2.mlp.experts")->device = Device::cuda(0);
  EXPECT_THROW(validatePlacement(p), Error);  // expert weights never live on a GPU
  p.find("model.layers.2.mlp.experts")->device = Device::numaNode(1);
  EXPECT_THROW(validatePlacement(p, &gpu0), Error);
  EXPECT_NO_THROW(validatePlacement(p, &two_nodes));
  // cpu:numaK pins that layer's experts to node K at run time; cpu splits them over every node.
  const RuntimePlacement runtime = toRuntimePlacement(p);
  ASSERT_GT(runtime.experts_numa_node.size(), 3u);
  EXPECT_EQ(runtime.experts_numa_node[2], 1);
  EXPECT_EQ(runtime.experts_numa_node[3], -1);
  p.find("model.layers.2.mlp.experts")->backend = "amx_bf16";
  EXPECT_THROW(toRuntimePlacement(p), Error);  // one backend for every layer at run time
}

}  // namespace
}  // namespace tandem::placement
