#include "engine/model/machine_probe.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#ifdef TANDEM_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "engine/gpu/torch_runtime.h"

namespace tandem::model {

namespace {

#ifdef TANDEM_WITH_CUDA
namespace fs = std::filesystem;

std::string firstLine(const fs::path& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}
#endif

// PCIe link of GPU `gpu.index` from sysfs ("16.0 GT/s PCIe" -> gen 4); unknown (0) when the build
// has no CUDA, which is also when libtorch lists no GPU.
void probePcieLink(placement::GpuSpec& gpu) {
#ifdef TANDEM_WITH_CUDA
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, gpu.index) != cudaSuccess) return;
  // CUDA writes "0000:3B:00.0"; sysfs names the device in lower case.
  std::string id(bus_id);
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
  const fs::path dir = fs::path("/sys/bus/pci/devices") / id;
  const double gts = std::atof(firstLine(dir / "current_link_speed").c_str());
  gpu.pcie_lanes = std::atoi(firstLine(dir / "current_link_width").c_str());
  // GT/s per lane of each generation: 2.5, 5, 8, 16, 32, 64.
  const double speeds[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
  for (int g = 0; g < 6; ++g) {
    if (std::abs(gts - speeds[g]) < 0.1) gpu.pcie_gen = g + 1;
  }
#else
  (void)gpu;
#endif
}

}  // namespace

placement::Hardware probeMachine(std::string* gpu_status) {
  const gpu::TorchRuntimeInfo torch = gpu::probeTorchRuntime();
  std::vector<placement::GpuSpec> gpus;
  for (const gpu::GpuInfo& g : torch.gpus) {
    placement::GpuSpec spec{g.index, g.name, g.total_bytes, g.free_bytes, 0, 0};
    probePcieLink(spec);
    gpus.push_back(std::move(spec));
  }
  if (gpu_status) *gpu_status = torch.gpu_status;
  return placement::probeHardware(std::move(gpus));
}

}  // namespace tandem::model
