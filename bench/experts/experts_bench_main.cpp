// tandem_bench_experts: `tandem bench experts` without the rest of the CLI, for machines where
// building the whole model engine costs more than the measurement (the H200 host's minutes).

#include <cstdio>
#include <exception>

#include "bench/experts/experts_bench_command.h"
#include "engine/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Tandem's expert-engine benchmark (same as `tandem bench experts`)",
               "tandem_bench_experts"};
  app.require_subcommand(1);
  tandem::bench::addExpertsBenchCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
