#pragma once
// A training output dir as Tandem owns it: the marker that says so (tandem_run.json: the tool,
// the kind, the config fingerprint and the names of every artefact a run may write there), the
// lock that keeps a second run out while one is in it, and the clean-up of what a killed run
// left behind. Tandem clears only the artefacts its marker lists, and only when nothing else is
// in the dir: anything it did not write is the user's and stays.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/platform/file_lock.h"

namespace tandem::train {

inline constexpr const char* kRunMarkerFile = "tandem_run.json";
inline constexpr const char* kRunLockFile = ".tandem_run.lock";
// What the old log of a run that starts afresh is moved to (one generation kept).
inline constexpr const char* kPreviousLogFile = "trainer_log.previous.jsonl";

// What a marker says; `ours` only when it names Tandem and a training output (an empty `{}`, or
// any JSON someone else wrote, does not).
struct RunMarker {
  bool ours = false;
  std::string config_fingerprint;
  std::vector<std::string> artefacts;  // names, or patterns with <N> / <pid> for digits
};

// The marker in `dir`; nullopt when there is none or it is not JSON.
std::optional<RunMarker> readRunMarker(const std::filesystem::path& dir);

// Writes `dir`'s marker for a run with this fingerprint and config (YAML), listing every artefact
// a run writes, before it writes any.
void writeRunMarker(const std::filesystem::path& dir, const std::string& fingerprint,
                    const std::string& config_yaml);

// Entries of `dir` its marker does not list (io::unlistedEntries): what Tandem did not write.
std::vector<std::string> foreignEntries(const std::filesystem::path& dir, const RunMarker& marker);

// Throws an Error listing what Tandem did not write when `dir` has no marker of Tandem's or holds
// anything its marker does not list; writes nothing.
void requireOnlyOwnRun(const std::filesystem::path& dir);

// Removes the run's artefacts from `dir` (not the lock file, which the caller holds), after
// requireOnlyOwnRun: nothing is removed from a dir that fails it.
void clearOwnRun(const std::filesystem::path& dir);

// The early check, before a run loads anything: an Error naming the holder's pid when another
// live run holds `dir`. Writes nothing (a dir without a lock file is left as it is); the lock
// itself is taken later by lockOutputDir.
void refuseIfOutputDirBusy(const std::filesystem::path& dir);

// Takes `dir` (created if missing) for this process until the returned lock is destroyed or the
// process ends. A dir another live run holds is an Error naming that run's pid.
platform::FileLock lockOutputDir(const std::filesystem::path& dir);

// Removes the .checkpoint-N.tmp-PID dirs of saves that failed or were killed. Call it holding the
// dir's lock: then no other process is writing one. Returns how many were removed.
int sweepCheckpointTemps(const std::filesystem::path& dir);

// A run that starts afresh (no checkpoint to resume) begins a new trainer_log.jsonl: the old one
// (a killed or finished run's) is moved to kPreviousLogFile, replacing an older one there.
void setAsidePreviousLog(const std::filesystem::path& dir);

}  // namespace tandem::train
