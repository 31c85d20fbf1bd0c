#include "engine/model/model_options.h"

#include <string>

#include "engine/core/error.h"

namespace tandem::model {

ExpertsMode parseExpertsMode(std::string_view text) {
  if (text == "cpu") return ExpertsMode::Cpu;
  if (text == "gpu-offload") return ExpertsMode::GpuOffload;
  if (text == "auto") return ExpertsMode::Auto;
  throw Error("experts mode '" + std::string(text) + "' is not known",
              "use auto (each expert to the CPU engine, streamed or resident, per step), cpu (the "
              "CPU expert engine) or gpu-offload (weights streamed to the GPU)");
}

std::string_view expertsModeName(ExpertsMode mode) {
  switch (mode) {
    case ExpertsMode::Cpu: return "cpu";
    case ExpertsMode::GpuOffload: return "gpu-offload";
    case ExpertsMode::Auto: return "auto";
  }
  return "cpu";
}

placement::Device ModelOptions::layerDevice(size_t layer) const {
  return layer < layer_devices.size() ? layer_devices[layer] : device;
}

placement::Device ModelOptions::headDevice() const {
  if (head_device) return *head_device;
  return layer_devices.empty() ? device : layer_devices.back();
}

int64_t ModelOptions::gpuExperts(size_t layer) const {
  return layer < gpu_experts.size() ? gpu_experts[layer] : 0;
}

}  // namespace tandem::model
