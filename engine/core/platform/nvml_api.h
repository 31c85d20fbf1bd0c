#pragma once
// The few NVML entry points gpu_telemetry uses, declared here with NVML's C ABI (nvml.h is not
// needed to build: the driver's library is found at run time) and read the same way on every
// platform. Only gpu_telemetry_*.cpp include this.

#include <cstdio>
#include <functional>
#include <type_traits>
#include <vector>

#include "engine/core/platform/gpu_telemetry.h"

namespace tandem::platform::nvml {

using Device = void*;
struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};
struct Memory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr int kSuccess = 0;
constexpr int kPcieTx = 0, kPcieRx = 1;  // nvmlPcieUtilCounter_t

struct Api {
  int (*init)() = nullptr;
  int (*count)(unsigned int*) = nullptr;
  int (*handle)(unsigned int, Device*) = nullptr;
  int (*name)(Device, char*, unsigned int) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
  int (*power)(Device, unsigned int*) = nullptr;      // milliwatts
  int (*pcie)(Device, int, unsigned int*) = nullptr;  // KB/s
  bool ready = false;  // every required entry point found and nvmlInit_v2 succeeded
};

// `symbol` finds an entry point of the loaded library (nullptr when absent).
inline Api load(const std::function<void*(const char*)>& symbol) {
  Api api;
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(symbol(name));
  };
  get(api.init, "nvmlInit_v2");
  get(api.count, "nvmlDeviceGetCount_v2");
  get(api.handle, "nvmlDeviceGetHandleByIndex_v2");
  get(api.name, "nvmlDeviceGetName");
  get(api.utilization, "nvmlDeviceGetUtilizationRates");
  get(api.memory, "nvmlDeviceGetMemoryInfo");
  get(api.power, "nvmlDeviceGetPowerUsage");
  get(api.pcie, "nvmlDeviceGetPcieThroughput");
  api.ready = api.init && api.count && api.handle && api.name && api.utilization && api.memory &&
              api.init() == kSuccess;
  return api;
}

inline std::vector<GpuTelemetry> read(const Api& api) {
  std::vector<GpuTelemetry> gpus;
  unsigned int count = 0;
  if (!api.ready || api.count(&count) != kSuccess) return gpus;
  for (unsigned int i = 0; i < count; ++i) {
    Device device = nullptr;
    if (api.handle(i, &device) != kSuccess) continue;
    GpuTelemetry g;
    g.index = static_cast<int>(i);
    char name[96] = {};
    if (api.name(device, name, sizeof name) == kSuccess) g.name = name;
    Utilization u{};
    if (api.utilization(device, &u) == kSuccess) g.utilisation_percent = u.gpu;
    Memory m{};
    if (api.memory(device, &m) == kSuccess) {
      g.memory_used_bytes = m.used;
      g.memory_total_bytes = m.total;
    }
    unsigned int value = 0;
    if (api.power && api.power(device, &value) == kSuccess) g.power_watts = value / 1000.0;
    if (api.pcie && api.pcie(device, kPcieRx, &value) == kSuccess)
      g.pcie_rx_bytes_per_second = value * 1024.0;
    if (api.pcie && api.pcie(device, kPcieTx, &value) == kSuccess)
      g.pcie_tx_bytes_per_second = value * 1024.0;
    gpus.push_back(g);
  }
  return gpus;
}

}  // namespace tandem::platform::nvml
