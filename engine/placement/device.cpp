#include "engine/placement/device.h"

#include <charconv>
#include <optional>

#include "engine/core/error.h"

namespace tandem::placement {

namespace {

std::optional<int> parseIndex(std::string_view text) {
  int value = 0;
  if (text.empty()) return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

}  // namespace

Device Device::parse(std::string_view text, std::string_view where) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    if (const auto index = parseIndex(text.substr(5))) return cuda(*index);
  } else if (text.starts_with("cpu:numa")) {
    if (const auto node = parseIndex(text.substr(8))) return numaNode(*node);
  } else if (text.starts_with("cpu:")) {
    if (const auto node = parseIndex(text.substr(4))) return numaNode(*node);
  }
  throw Error(std::string(where) + ": '" + std::string(text) + "' is not a device",
              "use cuda:N, cpu or cpu:numaK");
}

std::string Device::str() const {
  if (isGpu()) return "cuda:" + std::to_string(index_);
  return index_ < 0 ? "cpu" : "cpu:numa" + std::to_string(index_);
}

}  // namespace tandem::placement
