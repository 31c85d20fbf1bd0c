#pragma once
// Hardware: the machine a placement is planned for. Either probed (the CPU features and NUMA nodes
// here, the GPUs by whoever can see them: model::probeMachine asks libtorch) or read from a YAML
// preset in presets/hardware/, so a user can plan for a workstation they do not sit at. Plain
// structs, no libtorch or Qt: the studio lists them. docs/placement.md documents the preset schema.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "engine/placement/device.h"

namespace tandem::placement {

struct GpuSpec {
  int index = 0;             // cuda:<index>
  std::string name;          // "NVIDIA GeForce RTX 4090"
  uint64_t total_bytes = 0;  // device memory
  uint64_t free_bytes = 0;   // probed: free now; preset: = total
  int pcie_gen = 0;          // 0 = unknown
  int pcie_lanes = 0;        // 0 = unknown

  Device device() const { return Device::cuda(index); }
};

struct CpuSpec {
  std::string name;    // "Intel Xeon w9-3495X"
  std::string vendor;  // "intel" | "amd" | "other"
  int sockets = 1;
  int physical_cores = 0;  // over all sockets
  // What the expert kernels may use (probed: usable after OS support and AMX permission).
  bool avx2 = false, avx512 = false, avx512_bf16 = false, amx_bf16 = false, amx_int8 = false;
};

struct NumaNodeSpec {
  int id = 0;
  int cores = 0;             // CPUs of this node the process may use (probed) or cores (preset)
  uint64_t total_bytes = 0;  // RAM on the node
  uint64_t free_bytes =
      0;  // probed: available now (free + reclaimable page cache); preset: = total
};

struct Hardware {
  std::string name;    // preset name, or "this machine"
  std::string source;  // preset file, or "probe"
  std::vector<GpuSpec> gpus;
  CpuSpec cpu;
  std::vector<NumaNodeSpec> numa_nodes;  // never empty

  uint64_t ramBytes() const;
};

// The machine this process runs on with `gpus` as its GPUs: the CPU features (usable after OS
// support and the AMX permission) and the NUMA nodes with their available memory are probed here.
// The GPUs are an input so that placement/ needs neither libtorch nor CUDA
// (engine/model/machine_probe.h fills them).
Hardware probeHardware(std::vector<GpuSpec> gpus);

// Parses a preset; `label` (usually the path) names the source in errors. Every error names the
// label, the key and what is wrong (tandem::Error).
Hardware parseHardwarePreset(std::string_view yaml_text, const std::string& label);
Hardware loadHardwarePreset(const std::filesystem::path& file);

// The presets in `dir` (*.yaml, sorted by file name).
std::vector<std::filesystem::path> listHardwarePresets(const std::filesystem::path& dir);

// `spec` is a preset file path, or a preset name (file stem) in `presets_dir`; an unknown name
// is an Error listing the known ones.
Hardware resolveHardware(const std::string& spec, const std::filesystem::path& presets_dir);

// The hardware as a preset file: parseHardwarePreset(hardwareToYaml(h)) describes the same
// machine (free memory becomes total).
std::string hardwareToYaml(const Hardware& hardware);

}  // namespace tandem::placement
