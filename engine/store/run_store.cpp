#include "engine/store/run_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/paths.h"
#include "engine/core/platform/process_info.h"
#include "engine/store/sqlite.h"

namespace tandem::store {

namespace {

// PRAGMA application_id marks the file as ours ("Tndm"), so a stray --db pointing at another
// application's SQLite file is refused instead of being migrated into a run store.
constexpr int32_t kApplicationId = 0x546E646D;
constexpr int kBusyTimeoutMs = 5000;

// kMigrations[v] takes a database from schema version v to v + 1 (PRAGMA user_version).
// Append only: a released entry is never edited, so every old file migrates the same way.
constexpr const char* kMigrations[] = {
    // v0 -> v1
    R"sql(
    CREATE TABLE runs (
      id INTEGER PRIMARY KEY,
      name TEXT NOT NULL DEFAULT '',
      status TEXT NOT NULL CHECK (status IN
          ('running', 'paused', 'completed', 'stopped', 'failed', 'interrupted')),
      config_yaml TEXT NOT NULL DEFAULT '',
      config_fingerprint TEXT NOT NULL DEFAULT '',
      model TEXT NOT NULL DEFAULT '',
      dataset TEXT NOT NULL DEFAULT '',
      output_dir TEXT NOT NULL DEFAULT '',
      pid INTEGER,
      host TEXT,
      boot_id TEXT,
      created_at REAL NOT NULL,
      started_at REAL,
      finished_at REAL,
      updated_at REAL NOT NULL,
      total_steps INTEGER NOT NULL DEFAULT 0,
      last_step INTEGER,
      final_loss REAL,
      error TEXT
    );
    CREATE INDEX runs_by_output_dir ON runs (output_dir);
    CREATE INDEX runs_by_status ON runs (status);
    CREATE TABLE metrics (
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
      step INTEGER NOT NULL,
      loss REAL,
      learning_rate REAL,
      grad_norm REAL,
      tokens_per_s REAL,
      elapsed_s REAL,
      eta_s REAL,
      extra_json TEXT,
      PRIMARY KEY (run_id, step)
    ) WITHOUT ROWID;
    CREATE TABLE events (
      id INTEGER PRIMARY KEY,
      run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
      time REAL NOT NULL,
      kind TEXT NOT NULL,
      message TEXT NOT NULL
    );
    CREATE INDEX events_by_run ON events (run_id, id);
    )sql",
    // v1 -> v2: evaluation runs (`tandem eval`) beside training runs; old rows are training.
    R"sql(
    ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'train' CHECK (kind IN ('train', 'eval'));
    )sql",
};
constexpr int kSchemaVersion = static_cast<int>(std::size(kMigrations));

// ---- SQLite plumbing (engine/store/sqlite.h) -----------------------------------------------

using sqlite::DbHandle;
using sqlite::exec;
using sqlite::pragmaInt;
using sqlite::Statement;
using sqlite::throwSqlite;
using sqlite::Transaction;

// ---- facts about this process and machine ------------------------------------------------

double nowS() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// Absolute, symlinks resolved where they exist, no trailing separator: so that "out/", "./out"
// and "/home/me/out" find the same run.
std::string normalDir(const std::filesystem::path& dir) {
  if (dir.empty()) return "";
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(dir, ec);
  if (ec) p = std::filesystem::absolute(dir, ec).lexically_normal();
  if (ec) p = dir.lexically_normal();
  if (!p.has_filename() && p.has_relative_path()) p = p.parent_path();
  return p.string();
}

// ---- rows ----------------------------------------------------------------------------------

constexpr const char* kRunColumns =
    "id, name, status, config_yaml, config_fingerprint, model, dataset, output_dir, pid, host, "
    "created_at, started_at, finished_at, total_steps, last_step, final_loss, error, updated_at, "
    "kind";

RunRecord readRun(const Statement& s) {
  RunRecord r;
  r.id = s.integer(0);
  r.name = s.text(1);
  const std::string status = s.text(2);
  if (auto parsed = parseRunStatus(status)) {
    r.status = *parsed;
  } else {  // unreachable through the CHECK constraint; keep listing the other runs
    r.status = RunStatus::Failed;
    r.error = "unknown status '" + status + "' in the database";
  }
  r.config_yaml = s.text(3);
  r.config_fingerprint = s.text(4);
  r.model = s.text(5);
  r.dataset = s.text(6);
  r.output_dir = s.text(7);
  r.pid = s.integer(8);
  r.host = s.text(9);
  r.created_at = s.real(10);
  r.started_at = s.optReal(11);
  r.finished_at = s.optReal(12);
  r.total_steps = s.integer(13);
  r.last_step = s.optInteger(14);
  if (!s.isNull(14)) r.final_loss = s.isNull(15) ? std::nan("") : s.real(15);
  if (r.error.empty()) r.error = s.text(16);
  r.updated_at = s.real(17);
  r.kind = s.text(18) == "eval" ? RunKind::Eval : RunKind::Train;
  return r;
}

StepMetrics readStep(const Statement& s) {
  StepMetrics m;
  m.step = s.integer(0);
  m.loss = s.isNull(1) ? std::nan("") : s.real(1);
  m.learning_rate = s.optReal(2);
  m.grad_norm = s.optReal(3);
  m.tokens_per_s = s.optReal(4);
  m.elapsed_s = s.optReal(5);
  m.eta_s = s.optReal(6);
  m.extra_json = s.text(7);
  return m;
}

}  // namespace

// ---- status names --------------------------------------------------------------------------

std::string_view runStatusName(RunStatus status) {
  switch (status) {
    case RunStatus::Running: return "running";
    case RunStatus::Paused: return "paused";
    case RunStatus::Completed: return "completed";
    case RunStatus::Stopped: return "stopped";
    case RunStatus::Failed: return "failed";
    case RunStatus::Interrupted: return "interrupted";
  }
  return "failed";
}

std::string_view runKindName(RunKind kind) { return kind == RunKind::Eval ? "eval" : "train"; }

std::optional<RunStatus> parseRunStatus(std::string_view name) {
  for (RunStatus s : {RunStatus::Running, RunStatus::Paused, RunStatus::Completed,
                      RunStatus::Stopped, RunStatus::Failed, RunStatus::Interrupted}) {
    if (runStatusName(s) == name) return s;
  }
  return std::nullopt;
}

bool isLive(RunStatus status) {
  return status == RunStatus::Running || status == RunStatus::Paused;
}

double RunRecord::durationS(double now_s) const {
  if (!started_at) return 0;
  const double end = finished_at ? *finished_at : (isLive(status) ? now_s : updated_at);
  return std::max(0.0, end - *started_at);
}

// ---- RunStore ------------------------------------------------------------------------------

struct RunStore::Impl {
  std::filesystem::path path;
  DbHandle db;
  std::string host = platform::hostName();
  // Changes on every boot; tells a pid recorded before a reboot from a live process that happens
  // to have the same pid now (empty where the OS has none).
  std::string boot_id = platform::bootId();
  mutable std::mutex mutex;  // one connection, used by one thread at a time

  void checkIdentity();
  void migrate();
  void requireRun(int64_t run) const;
  void addEvent(int64_t run, double time, std::string_view kind, std::string_view message);
};

// Refuses files that are not ours before anything writes to them (even switching to WAL
// rewrites the header). The first read is also where a non-SQLite file shows up: NOTADB.
void RunStore::Impl::checkIdentity() {
  const int64_t app_id = pragmaInt(db.get(), "PRAGMA application_id");
  const int64_t version = pragmaInt(db.get(), "PRAGMA user_version");
  const int64_t objects = pragmaInt(db.get(), "SELECT count(*) FROM sqlite_schema");
  const bool blank = app_id == 0 && version == 0 && objects == 0;  // new, or an empty file
  if (app_id != kApplicationId && !blank) {
    throw Error("run database " + path.string() + " is an SQLite database of another program",
                "pass another path with --db or TANDEM_HOME, or move the file away");
  }
}

void RunStore::Impl::migrate() {
  // Checked outside a transaction first, so that opening an up-to-date store takes no write lock.
  if (pragmaInt(db.get(), "PRAGMA user_version") == kSchemaVersion) return;
  Transaction tx(db.get());
  // Read again under the write lock: another process may have migrated meanwhile.
  const int64_t version = pragmaInt(db.get(), "PRAGMA user_version");
  if (version > kSchemaVersion) {
    throw Error("run database " + path.string() + " was written by a newer Tandem (schema v" +
                    std::to_string(version) + "; this build reads up to v" +
                    std::to_string(kSchemaVersion) + ")",
                "upgrade Tandem, or use another database with --db or TANDEM_HOME");
  }
  if (version == kSchemaVersion) return;
  for (int64_t v = version; v < kSchemaVersion; ++v) exec(db.get(), kMigrations[v]);
  exec(db.get(), ("PRAGMA application_id = " + std::to_string(kApplicationId)).c_str());
  exec(db.get(), ("PRAGMA user_version = " + std::to_string(kSchemaVersion)).c_str());
  tx.commit();
  if (version > 0) {
    logInfo() << "run database " << path.string() << " migrated to schema v" << kSchemaVersion;
  }
}

void RunStore::Impl::requireRun(int64_t run) const {
  Statement s(db.get(), "SELECT 1 FROM runs WHERE id = ?");
  if (!s.bindInt(1, run).step()) {
    throw Error("no run " + std::to_string(run) + " in " + path.string(),
                "list the runs with `tandem runs --all`");
  }
}

void RunStore::Impl::addEvent(int64_t run, double time, std::string_view kind,
                              std::string_view message) {
  Statement(db.get(), "INSERT INTO events (run_id, time, kind, message) VALUES (?, ?, ?, ?)")
      .bindInt(1, run)
      .bindReal(2, time)
      .bindText(3, kind)
      .bindText(4, message)
      .run();
  Statement(db.get(), "UPDATE runs SET updated_at = ? WHERE id = ?")
      .bindReal(1, time)
      .bindInt(2, run)
      .run();
}

RunStore RunStore::open(const std::filesystem::path& db_path) {
  auto impl = std::make_unique<Impl>();
  impl->path = db_path;
  std::error_code ec;
  if (db_path.has_parent_path()) std::filesystem::create_directories(db_path.parent_path(), ec);
  if (ec) {
    throw Error("cannot create the directory for the run database " + db_path.string() + ": " +
                    ec.message(),
                "pass a writable path with --db, or set TANDEM_HOME");
  }
  sqlite3* raw = nullptr;
  const int rc =
      sqlite3_open_v2(db_path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  impl->db.reset(raw);  // sqlite3_open_v2 returns a handle to close even when it fails
  if (rc != SQLITE_OK) throwSqlite(raw, rc, "cannot open it", db_path.string());
  sqlite3* db = impl->db.get();
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, kBusyTimeoutMs);

  impl->checkIdentity();
  // WAL: readers never block the writer and see only committed transactions. With
  // synchronous=NORMAL a commit is durable against a killed process (the WAL is in the page
  // cache) but not against power loss, which may drop the last few steps; fine for metrics.
  {
    Statement wal(db, "PRAGMA journal_mode = WAL");
    const std::string mode = wal.step() ? wal.text(0) : "";
    if (mode != "wal") {
      logWarn() << "run database " << db_path.string()
                << ": WAL mode unavailable (journal_mode=" << mode
                << "); readers may wait for the writer";
    }
  }
  exec(db, "PRAGMA synchronous = NORMAL");
  exec(db, "PRAGMA foreign_keys = ON");
  impl->migrate();
  return RunStore(std::move(impl));
}

std::filesystem::path RunStore::defaultPath() { return dataDir() / "runs.db"; }

RunStore::RunStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RunStore::RunStore(RunStore&&) noexcept = default;
RunStore& RunStore::operator=(RunStore&&) noexcept = default;
RunStore::~RunStore() = default;

const std::filesystem::path& RunStore::path() const { return impl_->path; }

int64_t RunStore::createRun(const NewRun& run) {
  std::lock_guard lock(impl_->mutex);
  const double now = nowS();
  Statement s(
      impl_->db.get(),
      "INSERT INTO runs (name, status, config_yaml, config_fingerprint, model, dataset, "
      "output_dir, pid, host, boot_id, created_at, started_at, updated_at, total_steps, kind) "
      "VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
  s.bindText(1, run.name)
      .bindText(2, run.config_yaml)
      .bindText(3, run.config_fingerprint)
      .bindText(4, run.model)
      .bindText(5, run.dataset)
      .bindText(6, normalDir(run.output_dir))
      .bindInt(7, platform::currentProcessId())
      .bindText(8, impl_->host)
      .bindTextOrNull(9, impl_->boot_id)
      .bindReal(10, now)
      .bindReal(11, now)
      .bindReal(12, now)
      .bindInt(13, run.total_steps)
      .bindText(14, runKindName(run.kind))
      .run();
  return sqlite3_last_insert_rowid(impl_->db.get());
}

void RunStore::setStatus(int64_t run, RunStatus status, std::optional<std::string> error) {
  std::lock_guard lock(impl_->mutex);
  sqlite3* db = impl_->db.get();
  const double now = nowS();
  Transaction tx(db);
  impl_->requireRun(run);
  if (isLive(status)) {
    // Whoever (re)starts a run owns it: markInterrupted checks this pid from now on.
    Statement(db,
              "UPDATE runs SET status = ?1, pid = ?2, host = ?3, boot_id = ?4, "
              "finished_at = NULL, error = NULL, started_at = coalesce(started_at, ?5), "
              "updated_at = ?5 WHERE id = ?6")
        .bindText(1, runStatusName(status))
        .bindInt(2, platform::currentProcessId())
        .bindText(3, impl_->host)
        .bindTextOrNull(4, impl_->boot_id)
        .bindReal(5, now)
        .bindInt(6, run)
        .run();
  } else {
    Statement(db,
              "UPDATE runs SET status = ?1, finished_at = ?2, updated_at = ?2, "
              "error = coalesce(?3, error) WHERE id = ?4")
        .bindText(1, runStatusName(status))
        .bindReal(2, now)
        .bindTextOrNull(3, error.value_or(""))
        .bindInt(4, run)
        .run();
  }
  tx.commit();
}

void RunStore::recordStep(int64_t run, const StepMetrics& m) {
  if (m.step < 0) throw Error("step " + std::to_string(m.step) + " is negative");
  if (!m.extra_json.empty() && !nlohmann::json::accept(m.extra_json)) {
    throw Error("extra metrics for step " + std::to_string(m.step) + " are not valid JSON");
  }
  std::lock_guard lock(impl_->mutex);
  sqlite3* db = impl_->db.get();
  Transaction tx(db);
  Statement update(db,
                   "UPDATE runs SET last_step = ?, final_loss = ?, updated_at = ? WHERE id = ?");
  update.bindInt(1, m.step).bindReal(2, m.loss).bindReal(3, nowS()).bindInt(4, run).run();
  if (sqlite3_changes(db) == 0) impl_->requireRun(run);  // throws: no such run
  Statement(db,
            "INSERT INTO metrics (run_id, step, loss, learning_rate, grad_norm, tokens_per_s, "
            "elapsed_s, eta_s, extra_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (run_id, step) DO UPDATE SET loss = excluded.loss, "
            "learning_rate = excluded.learning_rate, grad_norm = excluded.grad_norm, "
            "tokens_per_s = excluded.tokens_per_s, elapsed_s = excluded.elapsed_s, "
            "eta_s = excluded.eta_s, extra_json = excluded.extra_json")
      .bindInt(1, run)
      .bindInt(2, m.step)
      .bindReal(3, m.loss)
      .bindReal(4, m.learning_rate)
      .bindReal(5, m.grad_norm)
      .bindReal(6, m.tokens_per_s)
      .bindReal(7, m.elapsed_s)
      .bindReal(8, m.eta_s)
      .bindTextOrNull(9, m.extra_json)
      .run();
  tx.commit();
}

void RunStore::recordStep(int64_t run, const StepEvent& event) {
  StepMetrics m;
  m.step = event.step;
  m.loss = event.loss;
  m.learning_rate = event.learning_rate;
  m.grad_norm = event.grad_norm;
  m.tokens_per_s = event.tokens_per_s;
  m.elapsed_s = event.elapsed_s;
  m.eta_s = event.eta_s;
  recordStep(run, m);
}

void RunStore::recordEvent(int64_t run, std::string_view kind, std::string_view message) {
  std::lock_guard lock(impl_->mutex);
  Transaction tx(impl_->db.get());
  impl_->requireRun(run);
  impl_->addEvent(run, nowS(), kind, message);
  tx.commit();
}

std::vector<RunRecord> RunStore::listRuns(const RunFilter& filter) const {
  std::string sql = std::string("SELECT ") + kRunColumns + " FROM runs";
  if (!filter.statuses.empty()) {
    sql += " WHERE status IN (";
    for (size_t i = 0; i < filter.statuses.size(); ++i) sql += i ? ", ?" : "?";
    sql += ")";
  }
  sql += " ORDER BY created_at DESC, id DESC";
  if (filter.limit > 0) sql += " LIMIT " + std::to_string(filter.limit);

  std::lock_guard lock(impl_->mutex);
  Statement s(impl_->db.get(), sql);
  for (size_t i = 0; i < filter.statuses.size(); ++i) {
    s.bindText(static_cast<int>(i) + 1, runStatusName(filter.statuses[i]));
  }
  std::vector<RunRecord> runs;
  while (s.step()) runs.push_back(readRun(s));
  return runs;
}

std::optional<RunRecord> RunStore::findRun(int64_t run) const {
  std::lock_guard lock(impl_->mutex);
  Statement s(impl_->db.get(), std::string("SELECT ") + kRunColumns + " FROM runs WHERE id = ?");
  if (!s.bindInt(1, run).step()) return std::nullopt;
  return readRun(s);
}

std::optional<RunRecord> RunStore::findByOutputDir(const std::filesystem::path& output_dir) const {
  const std::string dir = normalDir(output_dir);
  std::lock_guard lock(impl_->mutex);
  Statement s(impl_->db.get(), std::string("SELECT ") + kRunColumns +
                                   " FROM runs WHERE output_dir = ? "
                                   "ORDER BY created_at DESC, id DESC LIMIT 1");
  if (!s.bindText(1, dir).step()) return std::nullopt;
  return readRun(s);
}

std::vector<StepMetrics> RunStore::metrics(int64_t run, int64_t after_step) const {
  std::lock_guard lock(impl_->mutex);
  Statement s(impl_->db.get(),
              "SELECT step, loss, learning_rate, grad_norm, tokens_per_s, elapsed_s, eta_s, "
              "extra_json FROM metrics WHERE run_id = ? AND step > ? ORDER BY step");
  s.bindInt(1, run).bindInt(2, after_step);
  std::vector<StepMetrics> rows;
  while (s.step()) rows.push_back(readStep(s));
  return rows;
}

std::vector<RunEvent> RunStore::events(int64_t run, size_t last_n) const {
  std::lock_guard lock(impl_->mutex);
  Statement s(impl_->db.get(),
              "SELECT id, run_id, time, kind, message FROM "
              "(SELECT * FROM events WHERE run_id = ? ORDER BY id DESC LIMIT ?) ORDER BY id");
  s.bindInt(1, run).bindInt(2, last_n > 0 ? static_cast<int64_t>(last_n) : -1);
  std::vector<RunEvent> rows;
  while (s.step()) {
    rows.push_back({s.integer(0), s.integer(1), s.real(2), s.text(3), s.text(4)});
  }
  return rows;
}

int RunStore::markInterrupted() {
  std::lock_guard lock(impl_->mutex);
  sqlite3* db = impl_->db.get();
  Transaction tx(db);
  struct Orphan {
    int64_t id;
    double last_seen;
    std::string why;
  };
  std::vector<Orphan> orphans;
  {
    Statement s(db,
                "SELECT id, pid, host, boot_id, updated_at FROM runs "
                "WHERE status IN ('running', 'paused')");
    while (s.step()) {
      const int64_t pid = s.integer(1);
      const std::string host = s.text(2);
      const std::string boot = s.text(3);
      if (host != impl_->host) continue;
      std::string why;
      if (!boot.empty() && !impl_->boot_id.empty() && boot != impl_->boot_id) {
        why = "the machine restarted while the run was live (pid " + std::to_string(pid) + ")";
      } else if (pid <= 0 || pid > INT_MAX) {
        why = "the run has no owning process";
      } else if (platform::processIsGone(pid)) {
        why = "process " + std::to_string(pid) + " on " + host + " is gone";
      }
      if (!why.empty()) orphans.push_back({s.integer(0), s.real(4), std::move(why)});
    }
  }
  for (const Orphan& o : orphans) {
    // finished_at is when the run was last heard from, not now: the crash may be days old.
    Statement(db, "UPDATE runs SET status = 'interrupted', finished_at = ? WHERE id = ?")
        .bindReal(1, o.last_seen)
        .bindInt(2, o.id)
        .run();
    impl_->addEvent(o.id, nowS(), "interrupted", o.why);
  }
  tx.commit();
  return static_cast<int>(orphans.size());
}

}  // namespace tandem::store
