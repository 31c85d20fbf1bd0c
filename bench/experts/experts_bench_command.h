#pragma once
// `bench experts` as a CLI11 subcommand, so `tandem bench experts` and the light standalone
// `tandem_bench_experts experts` (no model engine to build: what the H200 host builds) are one
// code.

#include <CLI/CLI.hpp>

namespace tandem::bench {

// Adds the `experts` subcommand (options and the run) under `parent`.
void addExpertsBenchCommand(CLI::App& parent);

}  // namespace tandem::bench
