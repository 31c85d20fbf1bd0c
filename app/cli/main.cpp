// tandem: the command-line face of the engine. Subcommands live in *_command.cpp.

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "app/cli/commands.h"
#include "engine/core/error.h"
#include "engine/core/process_tuning.h"

int main(int argc, char** argv) {
  tandem::tuneOpenMpWaitAndMalloc(argv);
  CLI::App app{"Tandem: LoRA fine-tuning of huge MoE models by CPU/GPU co-computation", "tandem"};
  app.set_version_flag("--version", std::string("tandem ") + TANDEM_VERSION);
  app.require_subcommand(1);
  tandem::cli::addInfoCommand(app);
  tandem::cli::addInspectCommand(app);
  tandem::cli::addDebugCommand(app);
  tandem::cli::addRunsCommand(app);
  tandem::cli::addTrainCommand(app);
  tandem::cli::addDemoCommand(app);
  tandem::cli::addChatCommand(app);
#ifdef TANDEM_CLI_WITH_SERVER
  tandem::cli::addServeCommand(app);
#endif
  tandem::cli::addEvalCommand(app);
  tandem::cli::addDebugJiebaCommand(app);
  tandem::cli::addPlanCommand(app);
  tandem::cli::addBenchCommand(app);
  tandem::cli::addExportCommand(app);
  tandem::cli::addDoctorCommand(app);
#ifdef TANDEM_CLI_WITH_DOWNLOAD
  tandem::cli::addDownloadCommand(app);
#endif
  tandem::cli::addLaunchCommand(app);
  tandem::cli::addCompletionCommand(app);
  try {
    if (const auto launched = tandem::cli::launchIfForced(argc, argv)) return *launched;
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n  what to do: please report this as a bug\n",
                 e.what());
    return 2;
  }
  return 0;
}
