#pragma once
// --experts-backend, --experts-format and --gpu-experts of the commands that run a model (chat,
// serve, eval, debug); `tandem train` takes the same choices from its YAML (experts_backend /
// kt_backend, experts_format, gpu_experts / kt_num_gpu_experts).

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace tandem::cli {

inline void addExpertsOptions(CLI::App& command, std::string& backend, std::string& format,
                              int64_t& gpu_experts) {
  command
      .add_option("--experts-backend", backend,
                  "CPU kernels of the routed experts: auto, generic, avx512, avx512_bf16, amx_bf16, amx_int8 or onednn")
      ->capture_default_str();
  command
      .add_option("--experts-format", format,
                  "how the routed experts are held: auto, bf16, int8 (half the RAM; amx_int8) or fp8 (an fp8 checkpoint)")
      ->check(CLI::IsMember({"auto", "bf16", "int8", "fp8"}))
      ->capture_default_str();
  command
      .add_option("--gpu-experts", gpu_experts,
                  "routed experts per MoE layer resident on the layer's device (the most routed of the "
                  "first forward), the rest on the CPU engine")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

}  // namespace tandem::cli
