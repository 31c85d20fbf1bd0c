// `tandem info [--json]`: what this machine offers Tandem — CPU features (and whether AMX is
// usable, and if not why), NUMA nodes with their memory, RAM, GPUs, libtorch and CUDA versions.

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "app/cli/commands.h"
#include "engine/core/cpu_features.h"
#include "engine/core/numa.h"
#include "engine/core/platform/system_memory.h"
#include "engine/core/units.h"
#include "engine/gpu/torch_runtime.h"

namespace tandem::cli {

namespace {

struct MachineInfo {
  CpuFeatures cpu;
  NumaTopology numa;
  uint64_t ram_total_bytes = 0;
  uint64_t ram_available_bytes = 0;
  gpu::TorchRuntimeInfo torch;
};

MachineInfo probeMachine() {
  MachineInfo m;
  m.cpu = cpuFeatures();
  m.numa = detectNumaTopology();
  const platform::SystemMemoryBytes memory = platform::systemMemoryBytes();
  m.ram_total_bytes = memory.total_bytes;
  m.ram_available_bytes = memory.free_bytes + memory.buffer_bytes;
  m.torch = gpu::probeTorchRuntime();
  return m;
}

nlohmann::json featuresJson(const CpuFeatures& f) {
  return {{"avx2", f.avx2},
          {"fma", f.fma},
          {"f16c", f.f16c},
          {"avx512f", f.avx512f},
          {"avx512bw", f.avx512bw},
          {"avx512vl", f.avx512vl},
          {"avx512dq", f.avx512dq},
          {"avx512_vnni", f.avx512_vnni},
          {"avx512_bf16", f.avx512_bf16},
          {"avx512_fp16", f.avx512_fp16},
          {"amx_tile", f.amx_tile},
          {"amx_bf16", f.amx_bf16},
          {"amx_int8", f.amx_int8}};
}

nlohmann::json toJson(const MachineInfo& m) {
  nlohmann::json numa_nodes = nlohmann::json::array();
  for (const NumaNode& node : m.numa.nodes) {
    numa_nodes.push_back({{"id", node.id},
                          {"cpus", node.cpus},
                          {"total_bytes", node.total_bytes},
                          {"free_bytes", node.free_bytes}});
  }
  nlohmann::json gpus = nlohmann::json::array();
  for (const gpu::GpuInfo& g : m.torch.gpus) {
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"total_bytes", g.total_bytes},
                    {"free_bytes", g.free_bytes},
                    {"compute_capability",
                     std::to_string(g.compute_major) + "." + std::to_string(g.compute_minor)},
                    {"multiprocessors", g.multiprocessors}});
  }
  const CpuFeatures& f = m.cpu;
  return {
      {"tandem_version", TANDEM_VERSION},
      {"cpu",
       {{"vendor", f.vendor},
        {"brand", f.brand},
        {"logical_cpus", f.logical_cpus},
        {"features", featuresJson(f)},
        {"usable",
         {{"avx2", f.canUseAvx2()},
          {"avx512", f.canUseAvx512()},
          {"avx512_bf16", f.canUseAvx512Bf16()},
          {"avx512_fp16", f.canUseAvx512Fp16()},
          {"amx_bf16", f.canUseAmxBf16()},
          {"amx_int8", f.canUseAmxInt8()}}},
        {"amx_status", f.amx_status},
        {"best_isa", std::string(isaLevelName(f.bestLevel()))},
        {"isa_cap", std::string(isaLevelName(f.cap))}}},
      {"numa", {{"available", m.numa.numa_available}, {"nodes", numa_nodes}}},
      {"ram", {{"total_bytes", m.ram_total_bytes}, {"available_bytes", m.ram_available_bytes}}},
      {"torch",
       {{"version", m.torch.torch_version},
        {"has_cuda", m.torch.torch_has_cuda},
        {"tandem_built_with_cuda", m.torch.built_with_cuda},
        {"cuda_runtime", m.torch.cuda_runtime_version},
        {"intra_op_threads", m.torch.intra_op_threads}}},
      {"gpus", gpus},
      {"gpu_status", m.torch.gpu_status},
  };
}

const char* yesNo(bool value) { return value ? "yes" : "no"; }

void printHuman(const MachineInfo& m) {
  const CpuFeatures& f = m.cpu;
  std::printf("Tandem %s\n\n", TANDEM_VERSION);
  std::printf("CPU        %s (%s), %d logical CPUs\n", f.brand.c_str(), f.vendor.c_str(),
              f.logical_cpus);
  std::printf("  AVX2 %s   AVX-512 %s   AVX-512 BF16 %s   AVX-512 FP16 %s\n", yesNo(f.canUseAvx2()),
              yesNo(f.canUseAvx512()), yesNo(f.canUseAvx512Bf16()), yesNo(f.canUseAvx512Fp16()));
  std::printf("  AMX BF16 %s   AMX INT8 %s   (%s)\n", yesNo(f.canUseAmxBf16()),
              yesNo(f.canUseAmxInt8()), f.amx_status.c_str());
  std::printf("  expert kernels will use: %s%s\n", std::string(isaLevelName(f.bestLevel())).c_str(),
              f.cap == IsaLevel::Amx ? "" : "  (capped by TANDEM_CPU_ISA)");
  std::printf("RAM        %s total, %s free\n", formatBytes(m.ram_total_bytes).c_str(),
              formatBytes(m.ram_available_bytes).c_str());
  std::printf("NUMA       %s\n", m.numa.numa_available
                                     ? (std::to_string(m.numa.nodes.size()) + " node(s)").c_str()
                                     : "not available (one node assumed)");
  for (const NumaNode& node : m.numa.nodes) {
    std::printf("  node %d: %zu CPUs, %s (%s free)\n", node.id, node.cpus.size(),
                formatBytes(node.total_bytes).c_str(), formatBytes(node.free_bytes).c_str());
  }
  std::printf("libtorch   %s%s, intra-op threads %d\n", m.torch.torch_version.c_str(),
              m.torch.torch_has_cuda ? " (CUDA build)" : " (CPU build)", m.torch.intra_op_threads);
  if (!m.torch.cuda_runtime_version.empty()) {
    std::printf("CUDA       runtime %s\n", m.torch.cuda_runtime_version.c_str());
  }
  if (m.torch.gpus.empty()) {
    std::printf("GPUs       none: %s\n", m.torch.gpu_status.c_str());
    std::printf("           attention and dense layers will run on the CPU device\n");
  }
  for (const gpu::GpuInfo& g : m.torch.gpus) {
    std::printf("GPU %d      %s, %s (%s free), compute %d.%d, %d SMs\n", g.index, g.name.c_str(),
                formatBytes(g.total_bytes).c_str(), formatBytes(g.free_bytes).c_str(),
                g.compute_major, g.compute_minor, g.multiprocessors);
  }
}

}  // namespace

void addInfoCommand(CLI::App& app) {
  auto* command = app.add_subcommand("info",
                                     "Show what this machine offers: CPU features, NUMA, "
                                     "RAM, GPUs, libtorch/CUDA");
  auto json = std::make_shared<bool>(false);
  command->add_flag("--json", *json, "Print one JSON object instead of text");
  command->callback([json] {
    const MachineInfo machine = probeMachine();
    if (*json) {
      std::printf("%s\n", toJson(machine).dump(2).c_str());
    } else {
      printHuman(machine);
    }
  });
}

}  // namespace tandem::cli
