#pragma once
// RunStore: the history of training runs (one row per run, one per recorded step, a log of
// events) in one SQLite database, by default ~/.local/share/tandem/runs.db.
//
// Why SQLite in WAL mode: the trainer thread writes a step every few seconds while the studio
// (same process) and `tandem runs` (another process) read; WAL lets readers see every committed
// step without blocking the writer, and a killed process loses at most the transaction it was in.
// Schema and semantics: docs/run_store.md.
//
// Every method is thread-safe (one connection behind a mutex). Failures are tandem::Error naming
// the database file: a file that is not a Tandem database (or is damaged), a database written by a
// newer Tandem, a full disk, a lock held by another process for more than 5 s. The store never
// deletes or rewrites a file it did not create.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/train_events.h"

namespace tandem::store {

// 'running' and 'paused' are live: some process on `host` (pid) owns the run. The other four
// are final until someone resumes the run (setStatus(Running) again).
enum class RunStatus { Running, Paused, Completed, Stopped, Failed, Interrupted };

std::string_view runStatusName(RunStatus status);  // "running", ..., as stored
std::optional<RunStatus> parseRunStatus(std::string_view name);
bool isLive(RunStatus status);  // running or paused

// A training run (steps are optimizer steps) or an evaluation (`tandem eval`: one step row whose
// extra_json holds the scores, its step the number of samples scored).
enum class RunKind { Train, Eval };
std::string_view runKindName(RunKind kind);  // "train" | "eval", as stored

// What the trainer knows when it starts a run. The store fills in id, status (running),
// created_at/started_at (now), and the owner: this process's pid, host name and boot id.
struct NewRun {
  RunKind kind = RunKind::Train;
  std::string name;
  std::string config_yaml;         // the full config, as the user wrote it
  std::string config_fingerprint;  // hash of the normalised config (resume checks it)
  std::string model;
  std::string dataset;
  std::filesystem::path output_dir;
  int64_t total_steps = 0;
};

struct RunRecord {
  int64_t id = 0;
  RunKind kind = RunKind::Train;
  std::string name;
  RunStatus status = RunStatus::Running;
  std::string config_yaml;
  std::string config_fingerprint;
  std::string model;
  std::string dataset;
  std::filesystem::path output_dir;
  int64_t pid = 0;  // the owning process while live; the last owner afterwards
  std::string host;
  double created_at = 0;              // unix seconds
  std::optional<double> started_at;   // unix seconds; when the run first started
  std::optional<double> finished_at;  // unix seconds; set on a final status
  double updated_at = 0;              // unix seconds; the last write for this run
  int64_t total_steps = 0;
  std::optional<int64_t> last_step;  // the step most recently recorded
  std::optional<double> final_loss;  // the loss at last_step (NaN if it diverged)
  std::string error;                 // why it failed, if it did

  // Seconds from started_at to finished_at, or to now_s while live; 0 if never started.
  // A resumed run counts the time it spent stopped, too.
  double durationS(double now_s) const;
};

// One optimizer step. Optional fields are stored as NULL. A NaN loss is stored as NULL and read
// back as NaN (SQLite has no NaN), so a diverged run still records its steps.
struct StepMetrics {
  int64_t step = 0;  // >= 0
  double loss = 0;
  std::optional<double> learning_rate;
  std::optional<double> grad_norm;
  std::optional<double> tokens_per_s;
  std::optional<double> elapsed_s;  // since the run started
  std::optional<double> eta_s;      // estimated seconds left
  std::string extra_json;           // a JSON value (e.g. per-expert load), or empty for none
};

struct RunEvent {
  int64_t id = 0;
  int64_t run_id = 0;
  double time = 0;   // unix seconds
  std::string kind;  // e.g. "checkpoint", "warning", "paused", "resumed"
  std::string message;
};

struct RunFilter {
  std::vector<RunStatus> statuses;  // empty: any status
  size_t limit = 0;                 // the newest `limit` runs; 0: all
};

class RunStore {
 public:
  // Opens (creating it and its directories if needed) and migrates the schema forward.
  static RunStore open(const std::filesystem::path& db_path);
  // $TANDEM_HOME/runs.db, else $XDG_DATA_HOME/tandem/runs.db, else ~/.local/share/tandem/runs.db.
  static std::filesystem::path defaultPath();

  RunStore(RunStore&&) noexcept;
  RunStore& operator=(RunStore&&) noexcept;
  RunStore(const RunStore&) = delete;
  RunStore& operator=(const RunStore&) = delete;
  ~RunStore();

  const std::filesystem::path& path() const;

  int64_t createRun(const NewRun& run);
  // Running/Paused make this process the owner (pid, host, boot id) and clear finished_at and
  // error (a resumed run keeps its first started_at); a final status sets finished_at = now
  // and, when given, the error text. Throws Error if there is no such run.
  void setStatus(int64_t run, RunStatus status, std::optional<std::string> error = {});
  // Inserts or replaces the row for (run, step), and sets the run's last_step and final_loss.
  void recordStep(int64_t run, const StepMetrics& metrics);
  // A training step as the trainer reports it (its loss, learning rate, grad norm, tokens/s,
  // elapsed time and ETA; the rest of the event is not kept).
  void recordStep(int64_t run, const StepEvent& event);
  void recordEvent(int64_t run, std::string_view kind, std::string_view message);

  std::vector<RunRecord> listRuns(const RunFilter& filter = {}) const;  // newest first
  std::optional<RunRecord> findRun(int64_t run) const;
  // The newest run writing into this directory (compared as lexically normal absolute paths).
  std::optional<RunRecord> findByOutputDir(const std::filesystem::path& output_dir) const;
  // Ordered by step; only steps > after_step.
  std::vector<StepMetrics> metrics(int64_t run, int64_t after_step = -1) const;
  // Oldest first; with last_n > 0, only the last_n newest (still oldest first).
  std::vector<RunEvent> events(int64_t run, size_t last_n = 0) const;

  // Live runs whose owner is gone become 'interrupted' (with an event); returns how many.
  // Gone: on this host, and kill(pid, 0) says ESRCH, or the run was started before the last
  // boot. Runs owned by another host are left alone: we cannot see its processes.
  int markInterrupted();

 private:
  struct Impl;
  explicit RunStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::store
