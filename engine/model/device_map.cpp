#include "engine/model/device_map.h"

#include <charconv>
#include <optional>

#include "engine/core/error.h"

namespace tandem::model {

namespace {

std::optional<int> parseInt(std::string_view text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

std::vector<placement::Device> parseLayerDevices(std::string_view text, int num_layers,
                                                 placement::Device fallback) {
  std::vector<placement::Device> devices(static_cast<size_t>(num_layers), fallback);
  std::vector<bool> named(static_cast<size_t>(num_layers), false);
  const std::string hint =
      "write DEVICE:FIRST-LAST items separated by commas, e.g. cuda:0:0-13,cuda:1:14-27";
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) {
      if (comma == text.size()) break;
      throw Error("layer devices '" + std::string(text) + "' hold an empty item", hint);
    }
    const size_t colon = item.rfind(':');
    if (colon == std::string_view::npos) {
      throw Error("layer devices: '" + std::string(item) + "' names no layers", hint);
    }
    const std::string_view range = item.substr(colon + 1);
    const size_t dash = range.find('-');
    const std::optional<int> first = parseInt(range.substr(0, dash));
    const std::optional<int> last =
        dash == std::string_view::npos ? first : parseInt(range.substr(dash + 1));
    if (!first || !last || *first > *last) {
      throw Error("layer devices: '" + std::string(range) + "' in '" + std::string(item) +
                      "' is not a layer range FIRST-LAST",
                  hint);
    }
    if (*first < 0 || *last >= num_layers) {
      throw Error("layer devices: layers " + std::string(range) + " are outside the model's 0-" +
                      std::to_string(num_layers - 1),
                  "the model has " + std::to_string(num_layers) + " decoder layers");
    }
    const placement::Device device =
        placement::Device::parse(item.substr(0, colon), "layer devices");
    for (int layer = *first; layer <= *last; ++layer) {
      if (named[static_cast<size_t>(layer)]) {
        throw Error("layer devices: layer " + std::to_string(layer) + " is placed twice",
                    "give each layer one device");
      }
      named[static_cast<size_t>(layer)] = true;
      devices[static_cast<size_t>(layer)] = device;
    }
  }
  return devices;
}

std::string formatLayerDevices(const std::vector<placement::Device>& devices) {
  std::string out;
  for (size_t first = 0; first < devices.size();) {
    size_t last = first;
    while (last + 1 < devices.size() && devices[last + 1] == devices[first]) ++last;
    if (!out.empty()) out += ',';
    out += devices[first].str() + ":" + std::to_string(first);
    if (last > first) out += "-" + std::to_string(last);
    first = last + 1;
  }
  return out;
}

}  // namespace tandem::model
