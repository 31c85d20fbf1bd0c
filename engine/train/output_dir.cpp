#include "engine/train/output_dir.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/platform/process_info.h"
#include "engine/io/atomic_file.h"
#include "engine/io/bounded_json.h"
#include "engine/io/owned_dir.h"

namespace tandem::train {

namespace {

namespace fs = std::filesystem;

const char* const kTool = "tandem";
const char* const kKind = "training-output";

// Everything a training run writes into its output dir (trainer.cpp, training_run.cpp, the
// CLI's loss plot). A name added here is recorded by the next run's marker.
const std::vector<std::string>& runArtefacts() {
  static const std::vector<std::string> names = {kRunMarkerFile,
                                                 kRunLockFile,
                                                 "trainer_log.jsonl",
                                                 kPreviousLogFile,
                                                 "trainer_state.json",
                                                 "adapter_config.json",
                                                 "adapter_model.safetensors",
                                                 "lora_experts.safetensors",
                                                 "lora_experts_config.json",
                                                 "adapter_model.gguf",
                                                 "training_loss.png",
                                                 "checkpoint-<N>",
                                                 ".checkpoint-<N>.tmp-<pid>"};
  return names;
}

// The marker of Tandem releases before the tool/kind/artefacts fields: the 16-hex-digit config
// fingerprint and the YAML it was taken from. Its dir is cleared by the same rule (only the
// artefacts Tandem writes, only when nothing else is there), so an old run can be overwritten.
bool isLegacyMarker(const nlohmann::json& j) {
  if (j.contains("tool") || !j.contains("config") || !j["config"].is_string()) return false;
  const auto f = j.find("config_fingerprint");
  if (f == j.end() || !f->is_string()) return false;
  const std::string& hex = f->get_ref<const std::string&>();
  return hex.size() == 16 &&
         std::all_of(hex.begin(), hex.end(), [](char c) { return std::isxdigit(c) != 0; });
}

// The pid in a .checkpoint-N.tmp-PID name; nullopt for any other name.
std::optional<int64_t> checkpointTempPid(const std::string& name) {
  if (!io::isListedArtefact(name, {".checkpoint-<N>.tmp-<pid>"})) return std::nullopt;
  return std::stoll(name.substr(name.rfind('-') + 1));
}

// The lock file's note: a few bytes, read whole; empty when unreadable.
std::string readNote(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string text(256, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

}  // namespace

std::optional<RunMarker> readRunMarker(const fs::path& dir) {
  const fs::path file = dir / kRunMarkerFile;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  nlohmann::json j;
  try {
    j = io::readBoundedJsonFile(file, io::kStateJsonLimits);
  } catch (const Error&) {
    return std::nullopt;
  }
  if (!j.is_object()) return std::nullopt;
  RunMarker marker;
  if (const auto f = j.find("config_fingerprint"); f != j.end() && f->is_string())
    marker.config_fingerprint = f->get<std::string>();
  const auto artefacts = j.find("artefacts");
  marker.ours = j.value("tool", std::string()) == kTool &&
                j.value("kind", std::string()) == kKind && artefacts != j.end() &&
                artefacts->is_array();
  if (!marker.ours && isLegacyMarker(j)) {
    marker.ours = true;
    marker.artefacts = runArtefacts();
    return marker;
  }
  if (!marker.ours) return marker;
  for (const nlohmann::json& a : *artefacts)
    if (a.is_string()) marker.artefacts.push_back(a.get<std::string>());
  return marker;
}

void writeRunMarker(const fs::path& dir, const std::string& fingerprint,
                    const std::string& config_yaml) {
  const nlohmann::json marker = {{"tool", kTool},
                                 {"kind", kKind},
                                 {"config_fingerprint", fingerprint},
                                 {"artefacts", runArtefacts()},
                                 {"config", config_yaml}};
  io::writeFileAtomically(dir / kRunMarkerFile, marker.dump(2) + "\n");
}

std::vector<std::string> foreignEntries(const fs::path& dir, const RunMarker& marker) {
  return io::unlistedEntries(dir, marker.ours ? marker.artefacts : std::vector<std::string>{});
}

void requireOnlyOwnRun(const fs::path& dir) {
  const std::optional<RunMarker> marker = readRunMarker(dir);
  if (!marker || !marker->ours) {
    throw Error("output_dir " + dir.string() + " is not empty and was not written by Tandem (" +
                    io::nameList(foreignEntries(dir, RunMarker{})) +
                    "; no tandem_run.json naming a Tandem training output)",
                "choose another output_dir; Tandem only overwrites its own runs");
  }
  const std::vector<std::string> foreign = foreignEntries(dir, *marker);
  if (!foreign.empty()) {
    throw Error("output_dir " + dir.string() + " holds files Tandem did not write: " +
                    io::nameList(foreign) + "; overwrite_output_dir clears only Tandem's own run",
                "move those out of " + dir.string() + ", or choose another output_dir");
  }
}

void clearOwnRun(const fs::path& dir) {
  requireOnlyOwnRun(dir);
  // The marker goes last: a run killed while clearing still owns (and can clear) the dir.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name != kRunMarkerFile && name != kRunLockFile) fs::remove_all(entry.path());
  }
  fs::remove(dir / kRunMarkerFile);
}

namespace {

// Turns a run away from a dir another holds, naming the holder from the note it wrote when it
// took the lock (an empty note is a holder just starting).
[[noreturn]] void throwBusy(const fs::path& dir, const fs::path& file) {
  const std::optional<nlohmann::json> note =
      io::tryParseBoundedJson(readNote(file), io::kStateJsonLimits);
  std::string holder = "another Tandem run";
  if (note && note->is_object() && note->contains("pid") && (*note)["pid"].is_number_integer()) {
    const std::string host = note->value("host", std::string());
    holder += " (pid " + std::to_string((*note)["pid"].get<int64_t>()) +
              (host.empty() ? "" : " on " + host) + ")";
  }
  throw Error("output_dir " + dir.string() + " is in use by " + holder,
              "wait for that run to finish or stop it, or choose another output_dir");
}

void throwCannotLock(const fs::path& file, const std::error_code& error) {
  throw Error("cannot lock " + file.string() + ": " + error.message(),
              "check that output_dir is writable and on a file system with file locks (a local "
              "disk)");
}

}  // namespace

void refuseIfOutputDirBusy(const fs::path& dir) {
  const fs::path file = dir / kRunLockFile;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return;  // never ran here: nothing to create yet
  std::error_code error;
  const std::optional<platform::FileLock> probe = platform::FileLock::tryAcquire(file, error);
  if (!probe && !error) throwBusy(dir, file);
}

platform::FileLock lockOutputDir(const fs::path& dir) {
  fs::create_directories(dir);
  const fs::path file = dir / kRunLockFile;
  std::error_code error;
  std::optional<platform::FileLock> lock = platform::FileLock::tryAcquire(file, error);
  if (error) throwCannotLock(file, error);
  if (!lock) throwBusy(dir, file);
  const nlohmann::json note = {{"pid", platform::currentProcessId()},
                               {"host", platform::hostName()}};
  if (const std::error_code e = lock->writeNote(note.dump() + "\n"))
    throw Error("cannot write " + file.string() + ": " + e.message());
  return std::move(*lock);
}

int sweepCheckpointTemps(const fs::path& dir) {
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // Under the lock no live run writes here, so every temp dir is a dead save's, our own
    // pid's too (a pid is reused).
    if (!checkpointTempPid(name) || entry.is_symlink()) continue;
    std::error_code remove_error;
    fs::remove_all(entry.path(), remove_error);
    removed += remove_error ? 0 : 1;
  }
  return removed;
}

void setAsidePreviousLog(const fs::path& dir) {
  const fs::path log = dir / "trainer_log.jsonl";
  std::error_code ec;
  if (!fs::exists(log, ec)) return;
  fs::rename(log, dir / kPreviousLogFile);
}

}  // namespace tandem::train
