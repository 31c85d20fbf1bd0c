#include "ui/last_run.h"

#include <string>
#include <system_error>

#include "engine/core/error.h"
#include "engine/store/run_store.h"

namespace tandem::ui {

namespace fs = std::filesystem;

namespace {

bool isTaken(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir, ec) || ec;  // unreadable counts as taken: never write where we cannot look
}

}  // namespace

fs::path freshOutputDir(const fs::path& dir, const fs::path& also_taken) {
  auto taken = [&](const fs::path& candidate) {
    return isTaken(candidate) ||
           (!also_taken.empty() && candidate.lexically_normal() == also_taken.lexically_normal());
  };
  if (dir.empty() || !taken(dir)) return dir;
  fs::path base = dir;
  while (!base.empty() && !base.has_filename()) base = base.parent_path();  // "runs/a/" -> "runs/a"
  std::string stem = base.filename().string();
  int next = 2;
  // "run-3" continues at 4 rather than becoming "run-3-2".
  if (const size_t dash = stem.rfind('-'); dash != std::string::npos && dash + 1 < stem.size()) {
    const std::string digits = stem.substr(dash + 1);
    if (digits.size() < 6 && digits.find_first_not_of("0123456789") == std::string::npos) {
      next = std::stoi(digits) + 1;
      stem.resize(dash);
    }
  }
  for (;; ++next) {
    fs::path candidate = base.parent_path() / (stem + "-" + std::to_string(next));
    if (!taken(candidate)) return candidate;
  }
}

train::TrainConfig nextRunConfig(const train::TrainConfig& run) {
  train::TrainConfig next = run;
  next.resume = train::ResumeFrom::None;
  next.resume_path.clear();
  next.overwrite_output_dir = false;
  next.output_dir = freshOutputDir(run.output_dir, run.output_dir);
  return next;
}

std::optional<train::TrainConfig> lastRunConfig(const store::RunStore& store) {
  for (const store::RunRecord& run : store.listRuns()) {  // newest first
    if (run.kind != store::RunKind::Train) continue;
    train::TrainConfig config;
    try {
      config = train::parseTrainConfig(run.config_yaml, "run " + std::to_string(run.id));
    } catch (const Error&) {
      continue;  // recorded by a version whose keys this one does not read: try an older run
    }
    return nextRunConfig(config);
  }
  return std::nullopt;
}

}  // namespace tandem::ui
