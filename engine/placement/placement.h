#pragma once
// Placement: for every module of a model (HF names) the device it lives on, and for routed
// experts the backend that computes them and the format of their frozen weights.
//
//   model.embed_tokens                     embedding
//   model.layers.N.self_attn               attention (GQA or MLA) with its norms and rope
//   model.layers.N.mlp.gate                router (MoE layers)
//   model.layers.N.mlp.shared_experts      shared experts (deepseek; qwen2_moe: mlp.shared_expert)
//   model.layers.N.mlp.experts             routed experts
//   model.layers.N.mlp                     dense MLP (dense layers only)
//   model.norm, lm_head
//
// Devices (device.h): cuda:N, cpu (the whole host) or cpu:numaK (one NUMA node). Routed experts:
// device = where their weights live (cpu, cpu:numaK); backend amx_bf16 | amx_int8 |
// avx512_bf16 | avx512 | avx2 | onednn | generic | auto compute them there, "gpu-offload" streams
// them from pinned host memory to `compute_device` per layer (the ZeRO-Offload baseline). Sources:
// the memory planner, a preset (presets/placement/*.yaml) and KTransformers rule files
// (kt_rules.h). Plain structs, no libtorch or Qt: the studio lists and edits them.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/placement/device.h"

namespace tandem::placement {

enum class ModuleKind : uint8_t {
  Embedding,
  Attention,
  Router,
  SharedExperts,
  RoutedExperts,
  DenseMlp,
  FinalNorm,
  LmHead
};
inline constexpr int kModuleKindCount = 8;
std::string_view moduleKindName(ModuleKind kind);  // "embedding", "attention", ...

struct ModulePlacement {
  std::string name;  // HF module name
  ModuleKind kind = ModuleKind::Attention;
  int layer = -1;  // decoder layer, -1 for embed / norm / lm_head
  Device device;
  // Routed experts only (empty otherwise).
  std::string backend;        // see kExpertBackends
  std::string weight_format;  // bf16 | int8 | fp8 (| fp16 | fp32: unquantized checkpoints)
  std::optional<Device> compute_device;  // gpu-offload: the GPU that computes them
  // Co-computation: how many of them (the most routed) live on their layer's GPU, computed
  // there while the CPU engine computes the rest (engine/model/resident_experts.h).
  int64_t gpu_experts = 0;
  // true: gpu_experts is the user's count for this layer (the studio's placement board, a rule
  // file's tandem_gpu_experts), which the planner keeps; false: the planner fills it.
  bool gpu_experts_fixed = false;

  bool operator==(const ModulePlacement&) const = default;
};

inline constexpr std::string_view kExpertBackends[] = {"auto",        "amx_bf16", "amx_int8",
                                                       "avx512_bf16", "avx512",   "avx2",
                                                       "onednn",      "generic",  "gpu-offload"};

struct Placement {
  std::vector<ModulePlacement> modules;  // model order: embed, layers 0..L-1, norm, lm_head

  const ModulePlacement* find(std::string_view name) const;
  ModulePlacement* find(std::string_view name);
  // Every distinct device named, GPUs first (cuda:0, cuda:1, cpu, cpu:numa0, ...).
  std::vector<Device> devices() const;
  // Each decoder layer's device, the one its attention is on ([num layers]): where the layer's
  // activations live, so where its resident experts go.
  std::vector<Device> layerDevices() const;
  bool operator==(const Placement&) const = default;
};

// The modules of `model` in order, all on cpu until the caller places them. Throws Error for a
// model with no layers.
Placement modulesOf(const io::ModelConfig& model);

struct Hardware;

// Checks a whole placement: experts in host memory with a backend and format from the lists
// above, gpu-offload with a GPU compute device. With `machine`, every device must be one of its
// GPUs or NUMA nodes (a machine planned for cuda:1 alone has no cuda:0). Throws Error naming the
// module.
void validatePlacement(const Placement& placement, const Hardware* machine = nullptr);

// The weight format the backend computes in when the user did not choose one: amx_int8 -> int8,
// amx_bf16 -> bf16 (they pack, converting), else the checkpoint's (fp8 for DeepSeek-V3-style fp8
// checkpoints, fp32/fp16 for such checkpoints, else bf16): the expert engine reads the checkpoint's
// weights in place.
std::string defaultWeightFormat(const std::string& backend, const io::ModelConfig& model);

// What engine/model's ModelOptions needs to run a placement, as plain fields (the runtime turns
// the devices into at::Device values): the embeddings' device, one device per decoder layer (its
// attention, router, shared experts, dense MLP and their LoRA), the head's device (model.norm
// and lm_head), and the experts' mode, backend and format.
struct RuntimePlacement {
  Device embed_device;
  std::vector<Device> layer_devices;
  Device head_device;
  std::string experts_mode;           // "cpu" | "gpu-offload"
  std::string experts_backend;        // the expert engine backend for "cpu"
  std::string experts_weight_format;  // bf16 | int8 | fp8 | fp16 | fp32
  // Per decoder layer: K when its experts are on cpu:numaK (computed on node K alone), -1 on cpu
  // (split over every NUMA node, docs/experts.md) or without routed experts.
  std::vector<int> experts_numa_node;
  std::vector<int64_t> gpu_experts;  // per decoder layer: experts resident on its GPU
};
// Throws Error when the placement asks for what the runtime cannot express: a layer's parts on
// different devices, lm_head away from model.norm, experts of different layers on different
// backends, offloaded experts computed away from their layer's GPU.
RuntimePlacement toRuntimePlacement(const Placement& placement);

// Placement presets (presets/placement/*.yaml): devices by module kind and layer range, e.g.
//   experts: {backend: amx_int8, weight_format: int8}
//   layers: [{layers: "0-29", device: "cuda:0"}, {layers: "30-60", device: "cuda:1"}]
// docs/placement.md has the schema. Applies to `model`; throws Error naming file and key.
Placement loadPlacementPreset(const std::filesystem::path& file, const io::ModelConfig& model);
Placement parsePlacementPreset(std::string_view yaml_text, const std::string& label,
                               const io::ModelConfig& model);

}  // namespace tandem::placement
