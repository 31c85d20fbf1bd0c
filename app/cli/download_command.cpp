// `tandem download REPO`: a Hugging Face model (or the files of it that --include names, e.g. one
// quantisation of a GGUF repo) into the huggingface_hub cache, with its size before it starts,
// progress, resume after an interruption and every file's checksum checked (docs/download.md).
#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "app/cli/commands.h"
#include "engine/core/error.h"
#include "engine/core/platform/interrupt.h"
#include "engine/core/platform/terminal.h"
#include "engine/core/units.h"
#include "engine/hub/hub_download.h"
#include "engine/hub/hub_repo.h"

namespace tandem::cli {
namespace {

struct DownloadCommandOptions {
  std::string repo;
  std::vector<std::string> include;
  std::string revision = "main";
  std::string local_dir;
  bool save_token = false;
  bool dry_run = false;
};

std::atomic<bool> g_stop{false};
void requestStop() { g_stop = true; }

void printProgress(const hub::DownloadProgress& p, bool terminal) {
  const double left = static_cast<double>(p.total - std::min(p.done, p.total));
  const std::string eta =
      p.bytes_per_second > 0 ? formatDuration(left / p.bytes_per_second) : std::string("?");
  std::fprintf(stderr, "%s[%d/%d] %s  %s / %s  %s/s  ETA %s%s", terminal ? "\r\033[K" : "",
               p.file_index, p.file_count, p.file.c_str(), formatBytes(p.done).c_str(),
               formatBytes(p.total).c_str(),
               formatBytes(static_cast<uint64_t>(p.bytes_per_second)).c_str(), eta.c_str(),
               terminal ? "" : "\n");
  std::fflush(stderr);
}

void runDownload(const DownloadCommandOptions& o) {
  const hub::HubSettings settings = hub::hubSettingsFromEnvironment();
  if (o.save_token) {
    std::fprintf(stderr, "Hub access token (from huggingface.co/settings/tokens): ");
    std::string token;
    std::getline(std::cin, token);
    hub::saveHubToken(settings, token);
    std::printf("saved the token in %s (readable by you alone)\n",
                (settings.home / "token").string().c_str());
    if (o.repo.empty()) return;
  }
  if (o.repo.empty())
    throw Error("no repo given", "tandem download OWNER/NAME [--include '*.gguf']");
  const hub::HubRepo repo = hub::fetchHubRepo(settings, o.repo, o.revision);
  const std::vector<hub::HubFile> files = hub::selectFiles(repo.files, o.include);
  if (files.empty()) {
    std::string listed;
    for (size_t i = 0; i < repo.files.size() && i < 12; ++i) listed += "\n  " + repo.files[i].path;
    throw Error("no file of " + o.repo + " matches --include", "the repo has:" + listed);
  }
  uint64_t total = 0;
  for (const hub::HubFile& f : files) total += f.size;
  hub::DownloadOptions options;
  options.revision = o.revision;
  options.local_dir = o.local_dir;
  const std::filesystem::path dir = hub::downloadDir(settings, repo, options);
  std::printf("%s @ %s: %zu file(s), %s, into %s\n", o.repo.c_str(),
              repo.commit.substr(0, 12).c_str(), files.size(), formatBytes(total).c_str(),
              dir.string().c_str());
  std::fflush(stdout);
  if (o.dry_run) {
    for (const hub::HubFile& f : files)
      std::printf("  %10s  %s\n", formatBytes(f.size).c_str(), f.path.c_str());
    return;
  }
  const bool terminal = platform::stdoutIsTerminal();
  options.progress = [terminal](const hub::DownloadProgress& p) { printProgress(p, terminal); };
  options.cancelled = [] { return g_stop.load(); };
  platform::ScopedInterruptHandler interrupt(requestStop,
                                             platform::InterruptKinds::CtrlCAndTerminate);
  const hub::DownloadResult result = hub::downloadFiles(settings, repo, files, options);
  if (terminal) std::fprintf(stderr, "\n");
  std::printf("done: %d file(s) fetched (%s), %d already there; checksums match the Hub's\n%s\n",
              result.files_fetched, formatBytes(result.bytes_fetched).c_str(), result.files_present,
              result.dir.string().c_str());
}

}  // namespace

void addDownloadCommand(CLI::App& app) {
  auto options = std::make_shared<DownloadCommandOptions>();
  auto* command = app.add_subcommand(
      "download",
      "Download a model from the Hugging Face Hub (HF_ENDPOINT, HF_HOME, HF_TOKEN honoured): "
      "size first, progress, resumes after an interruption, checksums checked");
  command->add_option("repo", options->repo, "OWNER/NAME, e.g. Qwen/Qwen3-30B-A3B");
  command->add_option("--include", options->include,
                      "only the files matching these globs, e.g. '*Q4_K_M*.gguf' '*.json'");
  command->add_option("--revision", options->revision, "branch, tag or commit (default main)");
  command->add_option("--local-dir", options->local_dir,
                      "into this folder instead of the Hugging Face cache");
  command->add_flag("--save-token", options->save_token,
                    "read a Hub access token from stdin and keep it in $HF_HOME/token (0600)");
  command->add_flag("--dry-run", options->dry_run, "list the files and their sizes, fetch nothing");
  command->callback([options] { runDownload(*options); });
}

}  // namespace tandem::cli
