#include "engine/model/checkpoint_dir.h"

#include <string>

#include "engine/core/error.h"

namespace tandem::model {

namespace fs = std::filesystem;

std::optional<int64_t> checkpointStep(const std::filesystem::path& dir) {
  const std::string name = dir.filename().string();
  const std::string prefix = "checkpoint-";
  if (!name.starts_with(prefix) || name.size() == prefix.size() ||
      name.size() > prefix.size() + 18) {
    return std::nullopt;
  }
  int64_t step = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

std::filesystem::path lastCheckpoint(const std::filesystem::path& output_dir) {
  std::filesystem::path best;
  int64_t best_step = -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(output_dir, ec)) {
    const auto step = checkpointStep(entry.path());
    if (!entry.is_directory() || !step) continue;
    if (!std::filesystem::exists(entry.path() / "trainer_state.json")) continue;  // incomplete
    if (*step > best_step) {
      best_step = *step;
      best = entry.path();
    }
  }
  return best;
}

fs::path resolveAdapterDir(const fs::path& dir) {
  if (!fs::is_directory(dir)) {
    throw Error("adapter " + dir.string() + " is not a directory",
                "give a PEFT adapter dir, a training output dir or one of its checkpoint-N dirs");
  }
  if (fs::exists(dir / "adapter_config.json")) return dir;
  if (fs::path last = lastCheckpoint(dir); !last.empty()) return last;
  throw Error(dir.string() + " holds no adapter_config.json and no complete checkpoint-N",
              "give a PEFT adapter dir, a training output dir or one of its checkpoint-N dirs");
}

}  // namespace tandem::model
