#pragma once
// Where a model's parts run: the per-decoder-layer device list and the routed experts' mode.
// The placement planner and the CLI both fill ModelOptions through these.
//
//   layer devices, as text:  "cuda:0:0-13,cuda:1:14-27"  (DEVICE:FIRST-LAST, inclusive, or
//                            DEVICE:N for one layer); layers not named stay on the default device.
//   experts mode:            "cpu"          routed experts on the CPU expert engine (co-computation)
//                            "gpu-offload"  weights streamed from pinned host memory to the layer's
//                                           device per layer, forward and backward (ZeRO-Offload)

#include <c10/core/Device.h>

#include <string>
#include <string_view>
#include <vector>

namespace tandem::model {

enum class ExpertsMode { Cpu, GpuOffload };

// "cpu" or "gpu-offload"; anything else is an Error naming both.
ExpertsMode parseExpertsMode(std::string_view text);
std::string_view expertsModeName(ExpertsMode mode);

// "cpu", "cuda:N" (also "cpu:0"); an Error that says what to write otherwise. A CUDA device
// is checked against the GPUs libtorch sees.
c10::Device parseDevice(std::string_view text);

// The device of each of `num_layers` layers from the text form above; `fallback` for layers the
// text does not name. Errors name the bad item: unknown device, range outside [0, num_layers),
// a layer named twice.
std::vector<c10::Device> parseLayerDevices(std::string_view text, int num_layers,
                                           c10::Device fallback);

// The text form of a device list, ranges merged ("cuda:0:0-13,cuda:1:14-27").
std::string formatLayerDevices(const std::vector<c10::Device>& devices);

}  // namespace tandem::model
