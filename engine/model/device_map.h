#pragma once
// The per-decoder-layer device list as text, for the `layer_devices` key and the CLI's
// --layer-devices override:
//   "cuda:0:0-13,cuda:1:14-27"  DEVICE:FIRST-LAST (inclusive) or DEVICE:N for one layer; layers
//                               not named stay on the fallback device.
// No libtorch: the devices are placement::Device values (torch_device.h maps them to torch).

#include <string>
#include <string_view>
#include <vector>

#include "engine/placement/device.h"

namespace tandem::model {

// The device of each of `num_layers` layers from the text form above; `fallback` for layers the
// text does not name. Errors name the bad item: unknown device, range outside [0, num_layers),
// a layer named twice.
std::vector<placement::Device> parseLayerDevices(std::string_view text, int num_layers,
                                                 placement::Device fallback);

// The text form of a device list, ranges merged ("cuda:0:0-13,cuda:1:14-27").
std::string formatLayerDevices(const std::vector<placement::Device>& devices);

}  // namespace tandem::model
