#include "engine/placement/lora_experts_budget.h"

#include <algorithm>
#include <map>

namespace tandem::placement {

namespace {

const std::string kLoraExpertsItem = "LoRA experts (";

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

uint64_t loraExpertPathBytes(int64_t hidden, int64_t le_dim, int64_t tokens) {
  const auto h = static_cast<uint64_t>(hidden), d = static_cast<uint64_t>(le_dim),
             t = static_cast<uint64_t>(tokens);
  const uint64_t state = 16 * 3 * h * d;
  const uint64_t activations = 4 * t * (h + 4 * d);
  return state + activations;
}

LoraExpertsChoice chooseLoraExperts(const MemoryPlan& plan, const PlanRequest& request,
                                    int64_t requested, int64_t le_dim) {
  LoraExpertsChoice choice;
  choice.le_dim = le_dim;
  const int64_t tokens = request.cutoff_len * request.batch_size;
  const uint64_t per_path = loraExpertPathBytes(request.model.hidden_size, le_dim, tokens);
  if (requested != kAutoLoraExperts) {
    choice.paths = requested;
    choice.bytes_per_layer = per_path * static_cast<uint64_t>(requested);
    if (requested > 0)
      choice.reason = std::to_string(requested) + " path(s) of le_dim " + std::to_string(le_dim) +
                      " per MoE layer (lora_experts: " + std::to_string(requested) + ")";
    return choice;
  }
  // MoE layers per GPU, by where each layer's activations live (its attention's device).
  std::map<int, int64_t> moe_layers_per_gpu;
  const std::vector<Device> layer_devices = plan.placement.layerDevices();
  for (size_t i = 0; i < layer_devices.size(); ++i) {
    if (layer_devices[i].isGpu() && request.model.isMoeLayer(static_cast<int>(i)))
      ++moe_layers_per_gpu[layer_devices[i].gpuIndex()];
  }
  if (moe_layers_per_gpu.empty()) {
    choice.paths = kLoraExpertsCpuDefault;
    choice.bytes_per_layer = per_path * static_cast<uint64_t>(choice.paths);
    choice.reason =
        "lora_experts: auto without MoE layers on a GPU: " + std::to_string(choice.paths) +
        " path of le_dim " + std::to_string(le_dim) + " per MoE layer (the CPU default)";
    return choice;
  }
  int64_t paths = kLoraExpertsAutoMax;
  uint64_t tightest_spare = 0;
  for (const auto& [gpu, layers] : moe_layers_per_gpu) {
    const DevicePlan* d = plan.device(Device::cuda(gpu));
    if (d == nullptr) continue;
    const auto usable =
        static_cast<uint64_t>(kGpuExpertsFill * static_cast<double>(d->capacity_bytes));
    // A plan that already carries LE (addLoraExpertsToPlan) is sized as without it: the same
    // choice every time it is asked.
    uint64_t planned = d->total();
    for (const PlanItem& item : d->items) {
      if (item.what.starts_with(kLoraExpertsItem)) planned -= item.bytes;
    }
    const uint64_t spare = usable > planned ? usable - planned : 0;
    const int64_t fit = static_cast<int64_t>(spare / (per_path * static_cast<uint64_t>(layers)));
    if (fit < paths) tightest_spare = spare;
    paths = std::min(paths, fit);
  }
  choice.paths = paths;
  choice.bytes_per_layer = per_path * static_cast<uint64_t>(paths);
  choice.reason = paths == 0 ? "lora_experts: auto: no GPU has room for one path of le_dim " +
                                   std::to_string(le_dim) + " per MoE layer (" +
                                   mib(tightest_spare) + " free); LE is off"
                             : "lora_experts: auto: " + std::to_string(paths) +
                                   " path(s) of le_dim " + std::to_string(le_dim) +
                                   " per MoE layer, " + mib(choice.bytes_per_layer) + " a layer" +
                                   (paths == kLoraExpertsAutoMax ? " (the auto maximum)"
                                                                 : " (what the GPUs have left)");
  return choice;
}

void addLoraExpertsToPlan(MemoryPlan& plan, const PlanRequest& request,
                          const LoraExpertsChoice& choice) {
  if (choice.paths <= 0) return;
  std::map<size_t, int64_t> layers_per_device;  // index into plan.devices -> MoE layers
  const std::vector<Device> layer_devices = plan.placement.layerDevices();
  for (size_t i = 0; i < layer_devices.size(); ++i) {
    if (!request.model.isMoeLayer(static_cast<int>(i))) continue;
    for (size_t d = 0; d < plan.devices.size(); ++d) {
      const Device device = plan.devices[d].device;
      if (layer_devices[i].isGpu() ? device == layer_devices[i] : !device.isGpu()) {
        ++layers_per_device[d];
        break;
      }
    }
  }
  for (const auto& [index, layers] : layers_per_device) {
    DevicePlan& d = plan.devices[index];
    const bool fitted = d.fits();
    const uint64_t bytes = choice.bytes_per_layer * static_cast<uint64_t>(layers);
    d.items.push_back({kLoraExpertsItem + std::to_string(choice.paths) + " x le_dim " +
                           std::to_string(choice.le_dim) + ", " + std::to_string(layers) +
                           " MoE layers)",
                       PlanCategory::LoraOptimizer, bytes});
    d.bytes[static_cast<size_t>(PlanCategory::LoraOptimizer)] += bytes;
    if (fitted && !d.fits()) {
      plan.fits = false;
      plan.problems.push_back(d.device.str() + ": need " + mib(d.total()) + ", have " +
                              mib(d.capacity_bytes) + " with the LoRA experts (" + mib(bytes) +
                              "); lower lora_experts or le_dim");
    }
  }
}

}  // namespace tandem::placement
