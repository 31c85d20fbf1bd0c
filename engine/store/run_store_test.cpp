#include "engine/store/run_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "engine/core/error.h"
#include "engine/core/platform/environment.h"
#include "engine/core/platform/process_info.h"

namespace tandem::store {
namespace {

namespace fs = std::filesystem;

// Runs one query on its own connection (as another process would) and returns the first column
// of the first row as text.
std::string rawQuery(const fs::path& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  std::string result;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK) {
    const int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW && sqlite3_column_text(stmt, 0)) {
      result = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    EXPECT_TRUE(rc == SQLITE_ROW || rc == SQLITE_DONE) << sql << ": " << sqlite3_errmsg(db);
  } else {
    ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return result;
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

NewRun sampleRun(const std::string& name, const fs::path& output_dir) {
  NewRun run;
  run.name = name;
  run.config_yaml = "model: qwen3-30b-a3b\nlora:\n  rank: 16\n";
  run.config_fingerprint = "sha256:abc";
  run.model = "Qwen/Qwen3-30B-A3B";
  run.dataset = "data/chat.jsonl";
  run.output_dir = output_dir;
  run.total_steps = 1000;
  return run;
}

StepMetrics step(int64_t n, double loss) {
  StepMetrics m;
  m.step = n;
  m.loss = loss;
  m.learning_rate = 1e-4;
  m.tokens_per_s = 1500;
  m.elapsed_s = static_cast<double>(n) * 2;
  return m;
}

// A pid that existed a moment ago and is gone now: a child that exits at once, reaped.
template <typename Fn>
pid_t runInChild(Fn&& fn) {
  const pid_t child = fork();
  if (child == 0) {
    int code = 0;
    try {
      fn();
    } catch (...) {
      code = 1;
    }
    _exit(code);
  }
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return child;
}

class RunStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tandem_run_store_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    db_path_ = dir_ / "runs.db";
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  fs::path db_path_;
};

TEST_F(RunStoreTest, CreatesDirectoriesAndSetsUpWal) {
  const fs::path nested = dir_ / "a" / "b" / "runs.db";
  { RunStore::open(nested); }
  EXPECT_TRUE(fs::exists(nested));
  EXPECT_EQ(rawQuery(nested, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(rawQuery(nested, "PRAGMA user_version"), "2");
  // Opening again is a no-op migration and keeps the data.
  int64_t id = 0;
  { id = RunStore::open(nested).createRun(sampleRun("r", dir_ / "out")); }
  RunStore again = RunStore::open(nested);
  ASSERT_TRUE(again.findRun(id));
  EXPECT_EQ(again.findRun(id)->name, "r");
}

TEST_F(RunStoreTest, CreateListUpdate) {
  RunStore store = RunStore::open(db_path_);
  const int64_t first = store.createRun(sampleRun("first", dir_ / "out1"));
  const int64_t second = store.createRun(sampleRun("second", dir_ / "out2"));
  EXPECT_NE(first, second);

  std::optional<RunRecord> r = store.findRun(first);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->name, "first");
  EXPECT_EQ(r->status, RunStatus::Running);
  EXPECT_EQ(r->model, "Qwen/Qwen3-30B-A3B");
  EXPECT_EQ(r->config_yaml, sampleRun("", "").config_yaml);
  EXPECT_EQ(r->pid, platform::currentProcessId());
  EXPECT_FALSE(r->host.empty());
  EXPECT_EQ(r->total_steps, 1000);
  EXPECT_FALSE(r->last_step);
  EXPECT_FALSE(r->finished_at);
  ASSERT_TRUE(r->started_at);
  EXPECT_GT(r->created_at, 1.6e9);
  EXPECT_EQ(r->output_dir, fs::weakly_canonical(dir_ / "out1"));

  std::vector<RunRecord> runs = store.listRuns();
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].id, second);  // newest first
  EXPECT_EQ(runs[1].id, first);

  store.setStatus(first, RunStatus::Completed);
  store.setStatus(second, RunStatus::Failed, "CUDA out of memory");
  r = store.findRun(first);
  EXPECT_EQ(r->status, RunStatus::Completed);
  ASSERT_TRUE(r->finished_at);
  EXPECT_GE(*r->finished_at, *r->started_at);
  EXPECT_GE(r->durationS(0), 0);
  EXPECT_EQ(store.findRun(second)->error, "CUDA out of memory");

  // Resuming makes this process the owner again and clears the error.
  store.setStatus(second, RunStatus::Running);
  EXPECT_EQ(store.findRun(second)->error, "");
  EXPECT_FALSE(store.findRun(second)->finished_at);

  EXPECT_EQ(store.listRuns({{RunStatus::Completed}}).size(), 1u);
  EXPECT_EQ(store.listRuns({{RunStatus::Completed, RunStatus::Running}}).size(), 2u);
  EXPECT_EQ(store.listRuns({{}, 1}).size(), 1u);

  EXPECT_FALSE(store.findRun(999));
  EXPECT_THROW(store.setStatus(999, RunStatus::Completed), Error);
}

TEST_F(RunStoreTest, EvalRunsKeepTheirKindAndVersion1FilesMigrate) {
  {
    RunStore store = RunStore::open(db_path_);
    NewRun eval = sampleRun("eval", dir_ / "eval");
    eval.kind = RunKind::Eval;
    const int64_t id = store.createRun(eval);
    const int64_t train = store.createRun(sampleRun("train", dir_ / "train"));
    EXPECT_EQ(store.findRun(id)->kind, RunKind::Eval);
    EXPECT_EQ(store.findRun(train)->kind, RunKind::Train);
  }
  // A version-1 file (before the kind column): its runs read back as training runs.
  rawQuery(db_path_, "ALTER TABLE runs DROP COLUMN kind");
  rawQuery(db_path_, "PRAGMA user_version = 1");
  RunStore store = RunStore::open(db_path_);
  EXPECT_EQ(rawQuery(db_path_, "PRAGMA user_version"), "2");
  const std::vector<RunRecord> runs = store.listRuns();
  ASSERT_EQ(runs.size(), 2u);
  for (const RunRecord& run : runs) EXPECT_EQ(run.kind, RunKind::Train);
  EXPECT_EQ(runKindName(RunKind::Eval), "eval");
}

TEST_F(RunStoreTest, FindByOutputDirNormalisesThePath) {
  RunStore store = RunStore::open(db_path_);
  fs::create_directories(dir_ / "out");
  const int64_t old_run = store.createRun(sampleRun("old", dir_ / "out"));
  const int64_t new_run = store.createRun(sampleRun("new", dir_ / "out/"));
  store.createRun(sampleRun("other", dir_ / "elsewhere"));

  ASSERT_TRUE(store.findByOutputDir(dir_ / "out"));
  EXPECT_EQ(store.findByOutputDir(dir_ / "out")->id, new_run);  // the newest one
  EXPECT_EQ(store.findByOutputDir(dir_ / "x" / ".." / "out" / "")->id, new_run);
  fs::create_directory_symlink(dir_ / "out", dir_ / "link");
  EXPECT_EQ(store.findByOutputDir(dir_ / "link")->id, new_run);
  EXPECT_FALSE(store.findByOutputDir(dir_ / "missing"));
  EXPECT_NE(old_run, new_run);
}

TEST_F(RunStoreTest, MetricsUpsertAndOrdering) {
  RunStore store = RunStore::open(db_path_);
  const int64_t run = store.createRun(sampleRun("m", dir_ / "out"));
  const int64_t other = store.createRun(sampleRun("o", dir_ / "out2"));
  store.recordStep(run, step(5, 1.5));
  store.recordStep(run, step(1, 2.5));
  store.recordStep(other, step(1, 9.0));
  store.recordStep(run, step(3, 2.0));
  StepMetrics redo = step(3, 1.9);  // a resumed run records step 3 again
  redo.grad_norm = 0.7;
  redo.extra_json = R"({"expert_load":[0.1,0.9]})";
  store.recordStep(run, redo);

  std::vector<StepMetrics> rows = store.metrics(run);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].step, 1);
  EXPECT_EQ(rows[1].step, 3);
  EXPECT_EQ(rows[2].step, 5);
  EXPECT_DOUBLE_EQ(rows[1].loss, 1.9);
  EXPECT_EQ(rows[1].grad_norm, 0.7);
  EXPECT_EQ(rows[1].extra_json, redo.extra_json);
  EXPECT_EQ(rows[0].learning_rate, 1e-4);
  EXPECT_FALSE(rows[0].grad_norm);
  EXPECT_FALSE(rows[0].eta_s);
  EXPECT_EQ(rows[0].extra_json, "");

  EXPECT_EQ(store.metrics(run, 1).size(), 2u);
  EXPECT_EQ(store.metrics(run, 5).size(), 0u);
  EXPECT_EQ(store.metrics(other).size(), 1u);

  const RunRecord r = *store.findRun(run);
  EXPECT_EQ(r.last_step, 3);  // the step recorded last
  EXPECT_EQ(r.final_loss, 1.9);

  // A diverged step is kept, its loss read back as NaN.
  store.recordStep(run, step(6, std::nan("")));
  EXPECT_TRUE(std::isnan(store.metrics(run, 5).at(0).loss));
  EXPECT_TRUE(std::isnan(*store.findRun(run)->final_loss));

  StepMetrics bad = step(7, 1.0);
  bad.extra_json = "{not json";
  EXPECT_THROW(store.recordStep(run, bad), Error);
  EXPECT_THROW(store.recordStep(run, step(-1, 1.0)), Error);
  EXPECT_THROW(store.recordStep(999, step(1, 1.0)), Error);
  EXPECT_EQ(store.metrics(999).size(), 0u);
  EXPECT_EQ(store.metrics(run).size(), 4u);
}

TEST_F(RunStoreTest, Events) {
  RunStore store = RunStore::open(db_path_);
  const int64_t run = store.createRun(sampleRun("e", dir_ / "out"));
  store.recordEvent(run, "started", "1000 steps");
  store.recordEvent(run, "checkpoint", "saved step 100");
  store.recordEvent(run, "warning", "grad norm 1e4 at step 150");

  std::vector<RunEvent> all = store.events(run);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].kind, "started");
  EXPECT_EQ(all[2].message, "grad norm 1e4 at step 150");
  EXPECT_EQ(all[1].run_id, run);
  EXPECT_LE(all[0].time, all[2].time);

  std::vector<RunEvent> last = store.events(run, 2);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0].kind, "checkpoint");  // still oldest first
  EXPECT_EQ(last[1].kind, "warning");

  EXPECT_THROW(store.recordEvent(999, "x", "y"), Error);
  EXPECT_TRUE(store.events(999).empty());
}

TEST_F(RunStoreTest, MarkInterruptedDeadPidButNotALiveOne) {
  // The child owns a run and exits without finishing it, as a crashed trainer would.
  runInChild([&] { RunStore::open(db_path_).createRun(sampleRun("crashed", dir_ / "a")); });
  RunStore store = RunStore::open(db_path_);
  const int64_t ours = store.createRun(sampleRun("live", dir_ / "b"));
  const int64_t crashed = store.listRuns().back().id;
  ASSERT_NE(store.findRun(crashed)->pid, platform::currentProcessId());

  EXPECT_EQ(store.markInterrupted(), 1);
  const RunRecord r = *store.findRun(crashed);
  EXPECT_EQ(r.status, RunStatus::Interrupted);
  ASSERT_TRUE(r.finished_at);
  EXPECT_LE(*r.finished_at, r.updated_at);
  ASSERT_FALSE(store.events(crashed).empty());
  EXPECT_EQ(store.events(crashed).back().kind, "interrupted");
  EXPECT_EQ(store.findRun(ours)->status, RunStatus::Running);
  EXPECT_EQ(store.markInterrupted(), 0);  // idempotent
}

TEST_F(RunStoreTest, MarkInterruptedAfterRebootAndNotOnOtherHosts) {
  RunStore store = RunStore::open(db_path_);
  const int64_t before_reboot = store.createRun(sampleRun("rebooted", dir_ / "a"));
  const int64_t remote = store.createRun(sampleRun("remote", dir_ / "b"));
  const int64_t paused = store.createRun(sampleRun("paused", dir_ / "c"));
  store.setStatus(paused, RunStatus::Paused);
  // Our own live pid, but recorded under another boot: the pid was reused.
  rawQuery(db_path_,
           "UPDATE runs SET boot_id = 'previous-boot' WHERE id = " + std::to_string(before_reboot));
  // A dead pid on another machine sharing the database: we cannot judge it.
  rawQuery(db_path_, "UPDATE runs SET host = 'elsewhere', pid = 999999999 WHERE id = " +
                         std::to_string(remote));

  EXPECT_EQ(store.markInterrupted(), 1);
  EXPECT_EQ(store.findRun(before_reboot)->status, RunStatus::Interrupted);
  EXPECT_EQ(store.findRun(remote)->status, RunStatus::Running);
  EXPECT_EQ(store.findRun(paused)->status, RunStatus::Paused);
}

// A trainer killed with SIGKILL in the middle of writing: every step it saw committed is there,
// the file is intact, and the run is recognised as interrupted.
TEST_F(RunStoreTest, SurvivesWriterKilledMidWrite) {
  const int64_t run = RunStore::open(db_path_).createRun(sampleRun("victim", dir_ / "out"));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    try {
      RunStore store = RunStore::open(db_path_);
      store.setStatus(run, RunStatus::Running);  // the child owns the run now
      for (int64_t n = 0;; ++n) {
        StepMetrics m = step(n, 3.0 / static_cast<double>(n + 1));
        m.extra_json = R"({"pad":")" + std::string(500, 'x') + "\"}";  // more pages per commit
        store.recordStep(run, m);
        if (n % 10 == 0) store.recordEvent(run, "checkpoint", "step " + std::to_string(n));
        if (write(fds[1], &n, sizeof(n)) != sizeof(n)) _exit(2);
      }
    } catch (...) {
      _exit(1);
    }
  }
  close(fds[1]);
  int64_t committed = -1;
  int64_t n = 0;
  while (committed < 300 && read(fds[0], &n, sizeof(n)) == sizeof(n)) committed = n;
  ASSERT_EQ(committed, 300) << "the writer died on its own";
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  while (read(fds[0], &n, sizeof(n)) == sizeof(n)) committed = n;  // what it wrote meanwhile
  close(fds[0]);

  EXPECT_EQ(rawQuery(db_path_, "PRAGMA integrity_check"), "ok");
  RunStore store = RunStore::open(db_path_);
  const std::vector<StepMetrics> rows = store.metrics(run);
  ASSERT_GE(static_cast<int64_t>(rows.size()), committed + 1);
  for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i].step, static_cast<int64_t>(i));
  EXPECT_EQ(store.findRun(run)->last_step, rows.back().step);
  EXPECT_EQ(store.findRun(run)->pid, child);

  EXPECT_EQ(store.markInterrupted(), 1);
  EXPECT_EQ(store.findRun(run)->status, RunStatus::Interrupted);
  EXPECT_EQ(rawQuery(db_path_, "PRAGMA integrity_check"), "ok");
}

TEST_F(RunStoreTest, CorruptFileIsAnErrorAndIsLeftAlone) {
  const std::string garbage(8192, 'G');
  std::ofstream(db_path_, std::ios::binary) << garbage;
  try {
    RunStore::open(db_path_);
    FAIL() << "opened a file that is not a database";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(db_path_.string()), std::string::npos) << e.what();
    EXPECT_NE(e.whatToDo().find("move it away"), std::string::npos) << e.what();
  }
  EXPECT_EQ(readFile(db_path_), garbage);
}

TEST_F(RunStoreTest, ForeignSqliteFileIsAnErrorAndIsLeftAlone) {
  rawQuery(db_path_, "CREATE TABLE photos (id INTEGER PRIMARY KEY)");
  const std::string before = readFile(db_path_);
  EXPECT_THROW(RunStore::open(db_path_), Error);
  EXPECT_EQ(readFile(db_path_), before);
  EXPECT_EQ(rawQuery(db_path_, "PRAGMA journal_mode"), "delete");

  // No tables, but marked by another program.
  const fs::path marked = dir_ / "marked.db";
  rawQuery(marked, "PRAGMA user_version = 1");
  EXPECT_THROW(RunStore::open(marked), Error);
  EXPECT_EQ(rawQuery(marked, "SELECT count(*) FROM sqlite_schema"), "0");
}

TEST_F(RunStoreTest, EmptyFileBecomesAStore) {
  std::ofstream(db_path_).close();  // e.g. `touch runs.db`
  RunStore store = RunStore::open(db_path_);
  EXPECT_EQ(store.listRuns().size(), 0u);
}

TEST_F(RunStoreTest, UnopenableFileIsAnError) {
  fs::create_directory(db_path_);  // a directory where the file should be
  try {
    RunStore::open(db_path_);
    FAIL() << "opened a directory";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(db_path_.string()), std::string::npos) << e.what();
  }
}

TEST_F(RunStoreTest, NewerSchemaIsAnError) {
  { RunStore::open(db_path_); }
  rawQuery(db_path_, "PRAGMA user_version = 99");
  try {
    RunStore::open(db_path_);
    FAIL() << "opened a database from the future";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("newer Tandem"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rawQuery(db_path_, "PRAGMA user_version"), "99");
}

// The trainer thread writes while the UI thread (same store) and another connection (as
// `tandem runs` in another process) read: readers always see a gap-free prefix that only grows.
TEST_F(RunStoreTest, ConcurrentWriterAndReaders) {
  RunStore store = RunStore::open(db_path_);
  RunStore other = RunStore::open(db_path_);
  const int64_t run = store.createRun(sampleRun("busy", dir_ / "out"));
  constexpr int64_t kSteps = 1000;
  std::atomic<bool> done = false;
  std::atomic<int> bad = 0;

  std::thread writer([&] {
    for (int64_t n = 0; n < kSteps; ++n) {
      store.recordStep(run, step(n, 1.0));
      if (n % 100 == 0) store.recordEvent(run, "checkpoint", std::to_string(n));
    }
    done = true;
  });
  auto reader = [&](const RunStore& s) {
    size_t seen = 0;
    while (!done) {
      const std::vector<StepMetrics> rows = s.metrics(run);
      if (rows.size() < seen) ++bad;
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i].step != static_cast<int64_t>(i)) ++bad;
      }
      seen = rows.size();
      s.listRuns();
      s.events(run, 5);
    }
  };
  std::thread same_store(reader, std::cref(store));
  std::thread other_connection(reader, std::cref(other));
  writer.join();
  same_store.join();
  other_connection.join();

  EXPECT_EQ(bad, 0);
  EXPECT_EQ(static_cast<int64_t>(other.metrics(run).size()), kSteps);
  EXPECT_EQ(other.findRun(run)->last_step, kSteps - 1);
  EXPECT_EQ(other.events(run).size(), 10u);
}

TEST_F(RunStoreTest, DefaultPath) {
  auto saved = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  const auto tandem_home = saved("TANDEM_HOME");
  const auto xdg = saved("XDG_DATA_HOME");
  const auto home = saved("HOME");

  platform::setEnvironmentVariable("TANDEM_HOME", "/srv/tandem");
  EXPECT_EQ(RunStore::defaultPath(), fs::path("/srv/tandem/runs.db"));
  platform::unsetEnvironmentVariable("TANDEM_HOME");
  platform::setEnvironmentVariable("XDG_DATA_HOME", "/x/data");
  EXPECT_EQ(RunStore::defaultPath(), fs::path("/x/data/tandem/runs.db"));
  platform::unsetEnvironmentVariable("XDG_DATA_HOME");
  platform::setEnvironmentVariable("HOME", "/home/me");
  EXPECT_EQ(RunStore::defaultPath(), fs::path("/home/me/.local/share/tandem/runs.db"));

  auto restore = [](const char* name, const std::optional<std::string>& v) {
    v ? platform::setEnvironmentVariable(name, v->c_str())
      : platform::unsetEnvironmentVariable(name);
  };
  restore("TANDEM_HOME", tandem_home);
  restore("XDG_DATA_HOME", xdg);
  restore("HOME", home);
}

TEST(RunStatus, NamesRoundTrip) {
  for (RunStatus s : {RunStatus::Running, RunStatus::Paused, RunStatus::Completed,
                      RunStatus::Stopped, RunStatus::Failed, RunStatus::Interrupted}) {
    EXPECT_EQ(parseRunStatus(runStatusName(s)), s);
  }
  EXPECT_FALSE(parseRunStatus("done"));
  EXPECT_TRUE(isLive(RunStatus::Paused));
  EXPECT_FALSE(isLive(RunStatus::Interrupted));
}

}  // namespace
}  // namespace tandem::store
