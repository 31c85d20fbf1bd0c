#pragma once
// A device a module lives on, as the planner, presets, rule files and the runtime name it:
//   cuda:N      GPU N
//   cpu         the host; routed experts split over every NUMA node
//   cpu:numaK   the host, NUMA node K alone (routed experts computed there)
// Text is parsed once where it comes in (YAML presets, KT rule files, CLI options, the studio's
// editor) and a Device is passed and compared as a value everywhere else. No libtorch:
// engine/model turns it into a torch device.

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::placement {

class Device {
 public:
  // Declared GPUs first, so ordered sets and sorts list GPUs before the host.
  enum class Kind : uint8_t { Cuda, Cpu };

  constexpr Device() = default;  // cpu
  static constexpr Device cpu() { return Device(Kind::Cpu, -1); }
  static constexpr Device numaNode(int node) { return Device(Kind::Cpu, node); }
  static constexpr Device cuda(int index) { return Device(Kind::Cuda, index); }

  // "cuda:N", "cuda" (cuda:0), "cpu", "cpu:numaK", or torch's "cpu:K", read as cpu:numaK (the
  // runtime gives each NUMA node its own torch device object, which is also how a CPU-only build
  // runs a model split over two "devices"); anything else is an Error that names `where` and
  // what to write instead.
  static Device parse(std::string_view text, std::string_view where = "device");

  Kind kind() const { return kind_; }
  bool isGpu() const { return kind_ == Kind::Cuda; }
  bool isCpu() const { return kind_ == Kind::Cpu; }
  int gpuIndex() const { return kind_ == Kind::Cuda ? index_ : -1; }
  // The NUMA node of cpu:numaK; -1 for the whole host (and for GPUs).
  int numaNode() const { return kind_ == Kind::Cpu ? index_ : -1; }
  // The host, whatever its NUMA node: what a torch device sees of cpu:numaK.
  Device host() const { return isCpu() ? cpu() : *this; }

  std::string str() const;  // the text form above, parse(str()) == *this

  auto operator<=>(const Device&) const = default;

 private:
  constexpr Device(Kind kind, int index) : kind_(kind), index_(index) {}
  Kind kind_ = Kind::Cpu;
  int index_ = -1;  // GPU index, or NUMA node (-1: the whole host)
};

}  // namespace tandem::placement
