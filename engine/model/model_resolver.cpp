#include "engine/model/model_resolver.h"

#include <algorithm>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/model/device_map.h"
#include "engine/placement/kt_rules.h"
#include "engine/placement/placement.h"

namespace tandem::model {

namespace {

using placement::Device;

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : "; ") + item;
  return out;
}

// "auto" or a count >= 0 (the config reader checked the text); -1 for auto.
int64_t gpuExpertsCount(const ModelRequest& request) {
  return request.gpu_experts == "auto" ? -1 : std::stoll(request.gpu_experts);
}

// config.json's dtype as safetensors and the expert engine spell it (float32 -> f32).
std::string shortDtype(const std::string& dtype) {
  if (dtype == "float32") return "f32";
  if (dtype == "bfloat16") return "bf16";
  if (dtype == "float16") return "f16";
  return dtype.empty() ? "not fp8" : dtype;
}

// Every backend the expert engine has passes through (ExpertLayer says which this CPU can run);
// other names from KTransformers configs fall back to the best available one, and say so.
std::string expertsBackend(const std::string& requested) {
  for (std::string_view built : placement::kExpertBackends) {
    if (built != "gpu-offload" && requested == built)
      return requested;  // offload is not a CPU engine
  }
  logWarn() << "experts backend '" << requested << "' is not built yet; using the best available";
  return "auto";
}

// Where the plan puts each part, and how many routed experts each layer keeps on its device. The
// planner's own placements are valid by construction (an offload plan on a machine without a
// GPU, or with layers evicted to the host, included: the runtime streams to the layer's device).
void placeLayersAsPlanned(ModelOptions& o, const placement::Placement& placement) {
  o.device = placement.find("model.embed_tokens")->device;
  o.head_device = placement.find("lm_head")->device;
  o.layer_devices = placement.layerDevices();
  o.gpu_experts.assign(o.layer_devices.size(), 0);
  o.experts_numa_node.assign(o.layer_devices.size(), -1);
  for (const placement::ModulePlacement& m : placement.modules) {
    if (m.kind != placement::ModuleKind::RoutedExperts) continue;
    const auto layer = static_cast<size_t>(m.layer);
    o.gpu_experts[layer] = m.gpu_experts;
    o.experts_numa_node[layer] = m.device.numaNode();
  }
  if (std::none_of(o.gpu_experts.begin(), o.gpu_experts.end(), [](int64_t n) { return n > 0; }))
    o.gpu_experts.clear();
}

// The plan's placement, and, when a rule file made it, that file's experts mode, backend and
// format too (checked against what the runtime can run).
void placeAsPlanned(ModelOptions& o, const ModelRequest& request,
                    const placement::MemoryPlan& plan) {
  placeLayersAsPlanned(o, plan.placement);
  if (request.placement_rule.empty()) {
    o.experts = parseExpertsMode(request.experts_mode);
    o.experts_backend = expertsBackend(request.experts_backend);
    // experts_format auto whose default did not fit: the smaller format the planner chose.
    o.experts_format = request.experts_format == "auto" && !plan.expert_format_choice.empty()
                           ? plan.expert_format_choice
                           : request.experts_format;
    return;
  }
  const placement::RuntimePlacement runtime = placement::toRuntimePlacement(plan.placement);
  o.experts = parseExpertsMode(runtime.experts_mode);
  o.experts_backend = expertsBackend(runtime.experts_backend.empty() ? request.experts_backend
                                                                     : runtime.experts_backend);
  // A rule file's int8 experts (weight_format: int8) are quantised at load like experts_format:
  // int8.
  o.experts_format = request.experts_format == "auto" && runtime.experts_weight_format == "int8"
                         ? "int8"
                         : request.experts_format;
}

// Resident expert counts are per GPU memory: a layer the override moves away from the device
// the planner counted them for keeps none.
void keepResidentWherePlanned(ModelOptions& o, const std::vector<Device>& planned) {
  for (size_t layer = 0; layer < o.gpu_experts.size(); ++layer) {
    if (o.layerDevice(layer) != planned[layer]) o.gpu_experts[layer] = 0;
  }
}

// The request's explicit choices win over the plan's.
void applyOverrides(ModelOptions& o, const ModelRequest& request, const io::ModelConfig& config) {
  const std::vector<Device> planned = o.layer_devices;
  const int layers = config.num_hidden_layers;
  if (request.device != "auto") {
    const Device device = Device::parse(request.device, "device");
    o.device = device;
    o.layer_devices.assign(static_cast<size_t>(layers), device);
    o.head_device = device;
  }
  if (!request.layer_devices.empty()) {
    o.layer_devices = parseLayerDevices(request.layer_devices, layers, o.device);
    o.head_device.reset();  // the last layer's, unless head_device says otherwise
  }
  if (!request.head_device.empty())
    o.head_device = Device::parse(request.head_device, "head device");
  keepResidentWherePlanned(o, planned);
  if (const int64_t count = gpuExpertsCount(request); count >= 0) {
    // A count is for every MoE layer, on whatever device it is (KTransformers' kt_num_gpu_experts);
    // on a CPU-only run that is how the resident path runs at all.
    o.gpu_experts.clear();  // none: the engine's empty list
    for (int layer = 0; count > 0 && layer < layers; ++layer) {
      o.gpu_experts.push_back(config.isMoeLayer(layer) ? count : 0);
    }
  }
}

// auto follows the memory planner (persistent when it fits, else its pool of two layers, which
// the expert engine fills in the background: the next layer's Wᵀ is built while the GPU runs the
// layers between). Generation runs no backward: on_demand keeps none.
experts::WtPolicy wtPolicy(const ModelRequest& request, const placement::MemoryPlan& plan) {
  if (!request.training) return experts::WtPolicy::OnDemand;
  if (request.experts_wt_policy == "auto") {
    return plan.transposed_weights == "pool" ? experts::WtPolicy::Background
                                             : experts::WtPolicy::Persistent;
  }
  return experts::parseWtPolicy(request.experts_wt_policy);
}

// experts_mode auto splits the experts between the CPU engine and a GPU: it needs a backward to
// balance (training) and a layer on a GPU, else it is cpu mode. expert_split: cycle (a
// diagnostic) runs the split on the CPU device too, where torch computes the "device" experts.
void resolveExpertSplit(ModelOptions& o, const ModelRequest& request) {
  if (o.experts != ExpertsMode::Auto) return;
  o.expert_split = parseExpertSplit(request.expert_split);
  o.resident_refresh_steps = request.resident_refresh_steps;
  bool any_gpu = o.layer_devices.empty() && o.device.isGpu();
  for (const Device& d : o.layer_devices) any_gpu = any_gpu || d.isGpu();
  if (!request.training || (!any_gpu && o.expert_split != ExpertSplitChoice::Cycle))
    o.experts = ExpertsMode::Cpu;
}

// experts_mode auto's memory: the planner charges it when the machine has a GPU (without one the
// run is cpu mode: resolveExpertSplit).
void planSplitExperts(placement::PlanRequest& r, const ModelRequest& request) {
  if (request.experts_mode != "auto" || !request.training) return;
  r.split_experts = true;
  r.split_refresh = request.resident_refresh_steps > 0;
}

}  // namespace

placement::PlanRequest planRequestFor(const ModelRequest& request, const io::ModelConfig& config) {
  placement::PlanRequest r;
  r.model = config;
  r.bf16 = request.bf16;
  r.training = request.training;
  r.gradient_checkpointing =
      request.training && (request.gradient_checkpointing || request.offload_checkpoints);
  r.offload_checkpoints = request.training && request.offload_checkpoints;
  r.moe_token_chunk = request.moe_token_chunk;
  r.loss_chunk_tokens = request.loss_chunk_tokens;
  r.experts_backend = request.experts_backend;
  // The runtime's choices: the experts' format as the planner spells it ("" = its default for the
  // backend and checkpoint), and on_demand Wᵀ is the planner's pool.
  if (request.experts_format == "fp8" &&
      !(config.quantization && config.quantization->quant_method == "fp8")) {
    throw Error("experts_format: fp8 keeps the checkpoint's fp8 experts, but this checkpoint is " +
                    shortDtype(config.dtype) + " (its config.json has no fp8 quantization_config)",
                "use experts_format: auto, bf16 or int8 (int8 quantises the experts at load)");
  }
  // "blocks" keeps a GGUF's own block types: the planner's default for such a checkpoint.
  if (request.experts_format != "auto" && request.experts_format != "blocks")
    r.expert_weight_format = request.experts_format;
  if (request.experts_mode == "gpu-offload") {
    // Offload mode streams (and keeps resident) the experts in the format the CPU backend would
    // pack them in; the planner then charges the pinned host copy, the offload buffers and the
    // resident cache instead of packs.
    if (r.expert_weight_format.empty() &&
        placement::defaultWeightFormat(r.experts_backend, config) == "int8") {
      r.expert_weight_format = "int8";
    }
    r.experts_backend = "gpu-offload";
  }
  planSplitExperts(r, request);
  const int64_t count = gpuExpertsCount(request);
  r.gpu_experts = count < 0 ? placement::kAutoGpuExperts : count;
  if (request.training &&
      request.experts_wt_policy != "auto") {  // on_demand and background: the same pool
    r.transposed_weights = request.experts_wt_policy == "persistent" ? "persistent" : "pool";
  }
  return r;
}

placement::Hardware usableHardware(const ModelRequest& request, placement::Hardware hardware) {
  if (request.device == "auto") return hardware;
  const Device device = Device::parse(request.device, "device");
  if (device.isCpu()) {
    hardware.gpus.clear();
    return hardware;
  }
  const auto it =
      std::find_if(hardware.gpus.begin(), hardware.gpus.end(),
                   [&](const placement::GpuSpec& g) { return g.index == device.gpuIndex(); });
  if (it == hardware.gpus.end()) {
    throw Error("device " + device.str() + " is not available: " + hardware.name + " has " +
                    std::to_string(hardware.gpus.size()) + " GPU(s)",
                hardware.gpus.empty() ? "use device: cpu (or auto)"
                                      : "use auto, cpu or cuda:0 .. cuda:" +
                                            std::to_string(hardware.gpus.size() - 1));
  }
  hardware.gpus = {*it};
  return hardware;
}

placement::MemoryPlan planModel(const placement::PlanRequest& plan_request,
                                const ModelRequest& request, const placement::Hardware& hardware) {
  if (request.placement_rule.empty()) return placement::planMemory(plan_request, hardware);
  return placement::evaluatePlacement(
      plan_request, hardware,
      placement::loadPlacementFile(request.placement_rule, plan_request.model));
}

void requireFits(const placement::MemoryPlan& plan, std::string_view what) {
  if (plan.fits) return;
  const std::string advice = joined(plan.advice);
  throw Error(
      "the memory planner says " + std::string(what) + " does not fit this machine (" +
          joined(plan.problems) + ")",
      advice + (advice.empty() ? "" : "; ") + "`tandem plan CONFIG.yaml` shows the whole plan");
}

ModelOptions resolveModelOptions(const ModelRequest& request, const io::ModelConfig& config,
                                 const placement::MemoryPlan& plan) {
  ModelOptions o;
  o.dtype = request.bf16 ? ModelDType::Bf16 : ModelDType::Fp32;
  placeAsPlanned(o, request, plan);
  applyOverrides(o, request, config);
  o.experts_wt_policy = wtPolicy(request, plan);
  o.experts_task_split = experts::parseTaskSplit(request.task_split);
  // Offloading checkpoints implies taking them.
  o.gradient_checkpointing =
      request.training && (request.gradient_checkpointing || request.offload_checkpoints);
  o.offload_checkpoints = request.training && request.offload_checkpoints;
  o.moe_token_chunk = request.moe_token_chunk;
  o.keep_expert_forward = request.training && plan.keep_expert_forward;  // when host RAM has room
  o.loss_chunk_tokens = request.loss_chunk_tokens;
  o.stream_experts_ahead = request.stream_experts_ahead;
  resolveExpertSplit(o, request);
  return o;
}

}  // namespace tandem::model
