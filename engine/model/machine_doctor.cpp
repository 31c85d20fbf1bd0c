#include "engine/model/machine_doctor.h"

#include <string>
#include <vector>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/numa.h"
#include "engine/core/paths.h"
#include "engine/core/units.h"
#include "engine/gpu/torch_runtime.h"
#include "engine/model/machine_probe.h"

namespace tandem::model {

namespace {

std::string gpuLine(const placement::GpuSpec& gpu) {
  std::string line = gpu.device().str() + " " + gpu.name + ", " + formatBytes(gpu.total_bytes) +
                     " (" + formatBytes(gpu.free_bytes) + " free)";
  if (gpu.pcie_gen > 0) {
    line += ", PCIe gen " + std::to_string(gpu.pcie_gen) + " x" + std::to_string(gpu.pcie_lanes);
  }
  return line;
}

MachineCheck checkOutputDir(const std::filesystem::path& output_dir) {
  if (!output_dir.empty()) return checkDiskAt(output_dir);
  try {
    return checkDiskAt(dataDir());
  } catch (const Error& error) {
    MachineCheck check{"disk", "Free disk in the output directory", CheckStatus::Fail,
                       std::string("no default output directory: ") + error.what(),
                       "set TANDEM_HOME or HOME, or give --output-dir"};
    return check;
  }
}

}  // namespace

MachineReport checkThisMachine(const std::filesystem::path& output_dir) {
  std::string gpu_status;
  const placement::Hardware hardware = probeMachine(&gpu_status);
  // probeMachine asked libtorch for the GPUs already; this second answer (cached by CUDA) adds
  // the versions the planner has no use for.
  const gpu::TorchRuntimeInfo torch = gpu::probeTorchRuntime();

  std::vector<NodeMemory> nodes;
  for (const placement::NumaNodeSpec& node : hardware.numa_nodes) {
    nodes.push_back({node.id, node.cores, node.total_bytes, node.free_bytes});
  }
  GpuFacts gpu;
  gpu.driver_version = readNvidiaDriverVersion();
  gpu.cuda_runtime_version = torch.cuda_runtime_version;
  gpu.torch_has_cuda = torch.torch_has_cuda;
  gpu.built_with_cuda = torch.built_with_cuda;
  gpu.gpu_status = gpu_status;
  for (const placement::GpuSpec& spec : hardware.gpus) gpu.gpus.push_back(gpuLine(spec));

  MachineReport report;
  report.checks.push_back(checkCpu(cpuFeatures()));
  report.checks.push_back(checkNuma(detectNumaTopology().numa_available, nodes));
  report.checks.push_back(checkHugePages(readHugePageFacts()));
  report.checks.push_back(checkGpu(gpu));
  report.checks.push_back(checkOutputDir(output_dir));
  report.checks.push_back(checkLocale(readLocaleFacts()));
  return report;
}

}  // namespace tandem::model
