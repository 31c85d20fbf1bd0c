// `tandem bench <what>`: Tandem's kernels against baselines measured in the same run. The
// experts benchmark lives in bench/experts (also built alone as tandem_bench_experts).

#include "app/cli/commands.h"
#include "bench/experts/experts_bench_command.h"

namespace tandem::cli {

void addBenchCommand(CLI::App& app) {
  CLI::App* bench =
      app.add_subcommand("bench", "Measure Tandem's kernels against baselines in the same run");
  bench->require_subcommand(1);
  bench::addExpertsBenchCommand(*bench);
}

}  // namespace tandem::cli
