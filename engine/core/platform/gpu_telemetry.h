#pragma once
// What NVIDIA's driver says about its GPUs right now, through NVML, which is loaded at run time
// (Linux: libnvidia-ml.so.1, Windows: nvml.dll, both installed with the driver): a machine without
// the driver, or a build run where NVML does not answer, gets an empty list, never an error.

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::platform {

struct GpuTelemetry {
  int index = 0;  // NVML's device index (CUDA's order unless CUDA_DEVICE_ORDER says otherwise)
  std::string name;
  double utilisation_percent = 0;  // of the last sample period, the driver's "GPU busy"
  uint64_t memory_used_bytes = 0;
  uint64_t memory_total_bytes = 0;
  double power_watts = 0;               // 0 when the board does not report it
  double pcie_rx_bytes_per_second = 0;  // host → device, the driver's last 20 ms
  double pcie_tx_bytes_per_second = 0;  // device → host
};

std::vector<GpuTelemetry> readGpuTelemetry();

}  // namespace tandem::platform
