// `tandem doctor [--output-dir DIR] [--json]`: checks this machine before a long run (CPU
// features and AMX permission, NUMA RAM, huge pages, GPU driver and CUDA, free disk where the run
// writes, the locale) and says what to fix. Exit status 1 when a check fails, so scripts can
// refuse to start a run; warnings alone exit 0.

#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/cli/commands.h"
#include "app/cli/plan_cost_model.h"
#include "engine/core/error.h"
#include "engine/core/machine_checks.h"
#include "engine/core/paths.h"
#include "engine/model/machine_doctor.h"

namespace tandem::cli {

namespace {

nlohmann::json toJson(const MachineReport& report, const std::filesystem::path& output_dir) {
  nlohmann::json checks = nlohmann::json::array();
  for (const MachineCheck& check : report.checks) {
    checks.push_back({{"id", check.id},
                      {"title", check.title},
                      {"status", std::string(checkStatusName(check.status))},
                      {"finding", check.finding},
                      {"fix", check.fix},
                      {"figures", check.figures}});
  }
  return {{"tandem_version", TANDEM_VERSION},
          {"output_dir", output_dir.string()},
          {"status", std::string(checkStatusName(report.worst()))},
          {"checks", checks}};
}

}  // namespace

void addDoctorCommand(CLI::App& app) {
  auto* command = app.add_subcommand(
      "doctor",
      "Check this machine before a long run (CPU/AMX, NUMA RAM, huge pages, GPU driver, disk, "
      "locale) and say what to fix; exits 1 when a check fails");
  struct Options {
    std::string output_dir;
    bool json = false;
    bool calibrate = false;
  };
  auto options = std::make_shared<Options>();
  command->add_option("--output-dir", options->output_dir,
                      "Where the run will write: its free disk is checked (default: the run "
                      "store's data directory)");
  command->add_flag("--json", options->json, "Print one JSON object instead of the table");
  command->add_flag("--calibrate", options->calibrate,
                    "Also measure the cost model's rates again (docs/cost_model.md), at "
                    "Qwen3-30B-A3B's expert shape");
  command->callback([options] {
    // Resolved here so the report names the directory it measured; without a home there is no
    // default, which the disk check reports (empty path) rather than this command failing.
    std::filesystem::path output_dir = options->output_dir;
    if (output_dir.empty()) {
      try {
        output_dir = dataDir();
      } catch (const Error&) {
      }
    }
    const MachineReport report = model::checkThisMachine(output_dir);
    if (options->json) {
      std::printf("%s\n", toJson(report, output_dir).dump(2).c_str());
    } else {
      std::printf("Tandem %s machine check\n\n%s", TANDEM_VERSION,
                  formatMachineReport(report).c_str());
    }
    if (options->calibrate && !options->json) printCalibration(2048, 768);
    // CLI11 turns a RuntimeError into this exit status without printing anything more.
    if (report.anyFailed()) throw CLI::RuntimeError(1);
  });
}

}  // namespace tandem::cli
