#pragma once
// Each subcommand of `tandem` registers itself on the CLI11 app and returns the exit code of
// its run through the callback it installs. Errors are tandem::Error, printed by main.

#include <CLI/CLI.hpp>
#include <optional>

namespace tandem::cli {

void addInfoCommand(CLI::App& app);
void addInspectCommand(CLI::App& app);
void addDebugCommand(CLI::App& app);
void addRunsCommand(CLI::App& app);
void addTrainCommand(CLI::App& app);
void addDemoCommand(CLI::App& app);
void addChatCommand(CLI::App& app);
void addServeCommand(CLI::App& app);  // only in builds with TANDEM_WITH_SERVER
void addEvalCommand(CLI::App& app);
void addDebugJiebaCommand(CLI::App& app);  // after addDebugCommand: adds `debug jieba`
void addPlanCommand(CLI::App& app);
void addBenchCommand(CLI::App& app);
void addExportCommand(CLI::App& app);
void addDoctorCommand(CLI::App& app);
void addLaunchCommand(CLI::App& app);
void addDownloadCommand(CLI::App& app);    // only in builds with TANDEM_WITH_DOWNLOAD
void addCompletionCommand(CLI::App& app);  // last: it describes every other command

// `tandem train ...` with LLaMA-Factory's FORCE_TORCHRUN=1 (and no RANK): starts this node's
// ranks as `tandem launch` would and returns the exit code; nullopt otherwise.
std::optional<int> launchIfForced(int argc, char** argv);

}  // namespace tandem::cli
