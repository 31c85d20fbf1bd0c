#pragma once
// Downloading a Hub repo's files: resumable (a cut transfer continues from its .incomplete file,
// in this run with a few retries and in the next run), checked (each file's sha256 or git blob id
// against what the Hub listed; a mismatch is removed and refused), into the huggingface_hub cache
// layout (HF_HOME/hub/models--owner--name/snapshots/<commit>/, refs/<revision>) so that
// transformers finds the files too, or into a folder of the user's.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "engine/hub/hub_repo.h"

namespace tandem::hub {

struct DownloadProgress {
  std::string file;
  int file_index = 0;  // 1-based
  int file_count = 0;
  uint64_t file_done = 0, file_size = 0;
  uint64_t done = 0, total = 0;  // all the files asked for, those already there included
  double bytes_per_second = 0;   // this run's transfer rate over the last seconds
};

struct DownloadOptions {
  std::filesystem::path local_dir;  // empty: the Hub cache layout under settings.home
  std::string revision = "main";    // what refs/<revision> records in the cache layout
  int max_attempts = 5;             // per file, each resuming where the last one stopped
  long stall_seconds = 60;          // no byte for this long counts as a dropped connection
  std::function<void(const DownloadProgress&)> progress;  // at most ~5 times a second
  std::function<bool()> cancelled;                        // true: stop, keeping what arrived
};

struct DownloadResult {
  std::filesystem::path dir;   // where the files are
  uint64_t bytes_fetched = 0;  // over the network in this run
  int files_fetched = 0;
  int files_present = 0;  // complete already, not fetched again
};

// Where `files` of `repo` go with these options.
std::filesystem::path downloadDir(const HubSettings& settings, const HubRepo& repo,
                                  const DownloadOptions& options);

DownloadResult downloadFiles(const HubSettings& settings, const HubRepo& repo,
                             const std::vector<HubFile>& files, const DownloadOptions& options);

// Hex digests of a file: sha256, and the git blob id sha1("blob <size>\0" + content).
std::string fileSha256(const std::filesystem::path& path);
std::string fileGitBlobSha1(const std::filesystem::path& path);

}  // namespace tandem::hub
