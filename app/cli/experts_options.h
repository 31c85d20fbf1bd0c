#pragma once
// --experts-backend and --experts-format of the commands that run a model for inference (chat,
// serve, eval); `tandem train` takes the same choices from its YAML (experts_backend /
// kt_backend, experts_format).

#include <CLI/CLI.hpp>

#include <string>

namespace tandem::cli {

inline void addExpertsOptions(CLI::App& command, std::string& backend, std::string& format) {
  command
      .add_option("--experts-backend", backend,
                  "CPU kernels of the routed experts: auto, generic, avx512, avx512_bf16, amx_bf16, amx_int8 or onednn")
      ->capture_default_str();
  command
      .add_option("--experts-format", format,
                  "how the routed experts are held: auto, bf16, int8 (half the RAM; amx_int8) or fp8 (an fp8 checkpoint)")
      ->check(CLI::IsMember({"auto", "bf16", "int8", "fp8"}))
      ->capture_default_str();
}

}  // namespace tandem::cli
