// resolveModelOptions: a run is placed as the memory planner judged it (the multi-GPU split by
// default, a rule file's placement when given), with the request's overrides on top, and a model
// built from the options applies them (AppliedPlacement read back from the loaded model).

#include "engine/model/model_resolver.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/model/model.h"
#include "engine/placement/hardware.h"
#include "engine/placement/kt_rules.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;
using placement::Device;

io::ModelConfig presetModel(const char* name) {
  return io::readModelConfig(fs::path(TANDEM_PRESETS_DIR) / "models" / name);
}
placement::Hardware presetHardware(const char* name) {
  return placement::resolveHardware(name, fs::path(TANDEM_PRESETS_DIR) / "hardware");
}

placement::MemoryPlan plan(const ModelRequest& request, const io::ModelConfig& config,
                           const placement::Hardware& hardware) {
  return planModel(planRequestFor(request, config), request, usableHardware(request, hardware));
}

// Each decoder layer's device and resident experts, as the plan has them.
struct PlannedLayers {
  std::vector<Device> devices;
  std::vector<int64_t> resident;
};
PlannedLayers plannedLayers(const placement::MemoryPlan& plan) {
  PlannedLayers out;
  out.devices = plan.placement.layerDevices();
  out.resident.assign(out.devices.size(), 0);
  for (const placement::ModulePlacement& m : plan.placement.modules) {
    if (m.kind == placement::ModuleKind::RoutedExperts)
      out.resident[static_cast<size_t>(m.layer)] = m.gpu_experts;
  }
  return out;
}

std::vector<int64_t> perLayer(const ModelOptions& o, size_t layers) {
  std::vector<int64_t> out(layers);
  for (size_t l = 0; l < layers; ++l) out[l] = o.gpuExperts(l);
  return out;
}

// The bug this replaces: the planner split the layers over both GPUs and judged that split, while
// the run put every layer on cuda:0 and dropped cuda:1's resident experts.
TEST(ResolveModelOptions, ADefaultRunOnTwoGpusRunsThePlannersSplit) {
  const io::ModelConfig qwen3 = presetModel("qwen3-30b-a3b.json");
  const ModelRequest request;  // device auto, gpu_experts auto: the planner decides
  const placement::MemoryPlan p =
      plan(request, qwen3, presetHardware("2x4090-24g_xeon-spr-2s_512g"));
  ASSERT_TRUE(p.fits);
  const ModelOptions o = resolveModelOptions(request, qwen3, p);
  const PlannedLayers planned = plannedLayers(p);
  ASSERT_EQ(planned.devices.size(), static_cast<size_t>(qwen3.num_hidden_layers));
  EXPECT_EQ(o.layer_devices, planned.devices);
  EXPECT_EQ(perLayer(o, planned.devices.size()), planned.resident);
  const std::set<Device> used(o.layer_devices.begin(), o.layer_devices.end());
  EXPECT_EQ(used, (std::set<Device>{Device::cuda(0), Device::cuda(1)}));
  EXPECT_GT(o.gpuExperts(0), 0);
  EXPECT_GT(o.gpuExperts(planned.devices.size() - 1), 0);  // cuda:1's layers keep theirs
  EXPECT_EQ(o.device, p.placement.find("model.embed_tokens")->device);
  EXPECT_EQ(o.headDevice(), p.placement.find("lm_head")->device);
}

TEST(ResolveModelOptions, ADeviceIsPlannedAloneAndRunsEveryLayer) {
  const io::ModelConfig qwen3 = presetModel("qwen3-30b-a3b.json");
  const placement::Hardware two_gpus = presetHardware("2x4090-24g_xeon-spr-2s_512g");
  ModelRequest request;
  request.device = "cuda:1";
  const placement::MemoryPlan p = plan(request, qwen3, two_gpus);
  EXPECT_EQ(p.device(Device::cuda(0)), nullptr);  // planned for cuda:1 alone
  const ModelOptions o = resolveModelOptions(request, qwen3, p);
  EXPECT_EQ(o.layer_devices,
            std::vector<Device>(static_cast<size_t>(qwen3.num_hidden_layers), Device::cuda(1)));
  EXPECT_EQ(o.headDevice(), Device::cuda(1));
  request.device = "cpu";
  const placement::MemoryPlan on_cpu = plan(request, qwen3, two_gpus);
  EXPECT_TRUE(resolveModelOptions(request, qwen3, on_cpu).gpu_experts.empty());
  request.device = "cuda:2";
  EXPECT_THROW(usableHardware(request, two_gpus), Error);
  request.device = "tpu";
  EXPECT_THROW(usableHardware(request, two_gpus), Error);
}

TEST(ResolveModelOptions, LayerDevicesOverrideThePlanAndMovedLayersKeepNoResidentExperts) {
  const io::ModelConfig qwen3 = presetModel("qwen3-30b-a3b.json");
  ModelRequest request;
  const placement::MemoryPlan p =
      plan(request, qwen3, presetHardware("2x4090-24g_xeon-spr-2s_512g"));
  request.layer_devices = "cuda:1:0";  // layer 0 was planned on cuda:0
  const ModelOptions o = resolveModelOptions(request, qwen3, p);
  EXPECT_EQ(o.layerDevice(0), Device::cuda(1));
  EXPECT_EQ(o.gpuExperts(0), 0);
  EXPECT_EQ(o.layerDevice(1), plannedLayers(p).devices[1]);
  EXPECT_EQ(o.gpuExperts(1), plannedLayers(p).resident[1]);
}

// A count is for every MoE layer: on the CPU build that is how the resident path runs at all.
TEST(ResolveModelOptions, AGpuExpertsCountAppliesToEveryMoeLayer) {
  const io::ModelConfig dsv2 = presetModel("deepseek-v2-lite.json");  // layer 0 is dense
  ModelRequest request;
  request.gpu_experts = "3";
  const placement::Hardware cpu_only = presetHardware("1x4090-24g_epyc-genoa-1s_384g");
  request.device = "cpu";
  const ModelOptions o = resolveModelOptions(request, dsv2, plan(request, dsv2, cpu_only));
  EXPECT_EQ(o.gpuExperts(0), 0);
  for (int l = 1; l < dsv2.num_hidden_layers; ++l)
    EXPECT_EQ(o.gpuExperts(static_cast<size_t>(l)), 3) << l;
}

TEST(ResolveModelOptions, TheRequestsOtherSettings) {
  const io::ModelConfig qwen3 = presetModel("qwen3-30b-a3b.json");
  const placement::Hardware hw = presetHardware("1x4090-24g_xeon-w7-spr_256g");
  ModelRequest request;
  request.bf16 = true;
  request.gradient_checkpointing = true;
  request.experts_backend = "avx512";
  request.experts_wt_policy = "on_demand";
  request.task_split = "columns";
  request.loss_chunk_tokens = 256;
  ModelOptions o = resolveModelOptions(request, qwen3, plan(request, qwen3, hw));
  EXPECT_EQ(o.dtype, ModelDType::Bf16);
  EXPECT_TRUE(o.gradient_checkpointing);
  EXPECT_EQ(o.experts_backend, "avx512");
  EXPECT_EQ(o.experts_wt_policy, experts::WtPolicy::OnDemand);
  EXPECT_EQ(o.experts_task_split, experts::TaskSplit::Columns);
  EXPECT_EQ(o.loss_chunk_tokens, 256);
  // Generation runs no backward: no Wᵀ kept, no checkpointing.
  request.training = false;
  request.experts_wt_policy = "persistent";
  o = resolveModelOptions(request, qwen3, plan(request, qwen3, hw));
  EXPECT_EQ(o.experts_wt_policy, experts::WtPolicy::OnDemand);
  EXPECT_FALSE(o.gradient_checkpointing);
  request.task_split = "diagonal";
  EXPECT_THROW(resolveModelOptions(request, qwen3, plan(request, qwen3, hw)), Error);
}

// A placement file (what the studio's placement editor writes, or a KT rule file) is planned and
// run as it is; its experts backend and int8 format reach the runtime.
TEST(ResolveModelOptions, ARuleFilesPlacementIsRunAsWritten) {
  const io::ModelConfig dsv3 = presetModel("deepseek-v3.json");
  ModelRequest request;
  request.placement_rule =
      fs::path(TANDEM_PRESETS_DIR) / "placement" / "deepseek-v3_2gpu_amx-int8.yaml";
  const placement::MemoryPlan p = plan(request, dsv3, presetHardware("2x4090-48g_xeon-gnr-2s_1t"));
  const ModelOptions o = resolveModelOptions(request, dsv3, p);
  EXPECT_EQ(o.layer_devices, plannedLayers(p).devices);
  EXPECT_EQ(o.experts_backend, "amx_int8");
  EXPECT_EQ(o.experts_format, "int8");
}

// The studio's placement board fixes each MoE layer's resident experts in the rule file it
// writes (tandem_gpu_experts): the run keeps those counts, layer by layer, where auto would fill
// every GPU layer alike.
TEST(ResolveModelOptions, ARuleFilesPerLayerResidentExpertsAreRunAsWritten) {
  const io::ModelConfig qwen3 = presetModel("qwen3-30b-a3b.json");
  const placement::Hardware two_gpus = presetHardware("2x4090-24g_xeon-spr-2s_512g");
  ModelRequest request;  // gpu_experts auto
  placement::Placement board = plan(request, qwen3, two_gpus).placement;
  std::vector<int64_t> counts;
  for (placement::ModulePlacement& m : board.modules) {
    if (m.kind != placement::ModuleKind::RoutedExperts) continue;
    m.gpu_experts = m.layer % 4;
    m.gpu_experts_fixed = true;
    counts.push_back(m.gpu_experts);
  }
  const fs::path file =
      fs::temp_directory_path() / ("tandem_board_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(file) << placement::writeKtRules(board, qwen3);
  request.placement_rule = file;
  const placement::MemoryPlan p = plan(request, qwen3, two_gpus);
  fs::remove(file);
  const ModelOptions o = resolveModelOptions(request, qwen3, p);
  EXPECT_EQ(o.layer_devices, board.layerDevices());
  EXPECT_EQ(perLayer(o, counts.size()), counts);
}

// The loaded model applies the options: a model split over two devices (the CPU build's two
// device objects, cpu and cpu:numa0, as the parity tests split models) by a placement file
// reports back exactly the planned devices and resident experts per layer.
TEST(AppliedPlacement, AModelLoadedWithTheOptionsIsWhereThePlanPutIt) {
  const io::ModelConfig tiny = io::parseModelConfig(R"({"architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "vocab_size": 64, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": false, "dtype": "float32"})",
                                                    "tiny config");
  const fs::path file =
      fs::temp_directory_path() / ("tandem_split_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(file)
      << "embed_tokens: cpu\nlm_head: cpu:numa0\nexperts: {device: cpu, backend: auto}\n"
         "layers:\n  - {layers: \"0\", device: cpu}\n  - {layers: \"1-\", device: cpu:numa0}\n";
  ModelRequest request;
  request.placement_rule = file;
  request.gpu_experts = "2";
  placement::Hardware host = presetHardware("1x4090-24g_epyc-genoa-1s_384g");
  host.gpus.clear();
  const placement::MemoryPlan p = plan(request, tiny, host);
  fs::remove(file);
  const ModelOptions o = resolveModelOptions(request, tiny, p);
  const auto model = Model::random(tiny, o, nullptr, /*seed=*/3, ThreadPool::global());
  const AppliedPlacement applied = model->placement();
  EXPECT_EQ(applied.layers,
            (std::vector<Device>{Device::cpu(), Device::numaNode(0), Device::numaNode(0)}));
  EXPECT_EQ(applied.layers, plannedLayers(p).devices);
  EXPECT_EQ(applied.embed, Device::cpu());
  EXPECT_EQ(applied.head, Device::numaNode(0));
  EXPECT_EQ(applied.resident_experts, (std::vector<int64_t>{2, 2, 2}));
}

}  // namespace
}  // namespace tandem::model
