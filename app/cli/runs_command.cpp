// `tandem runs [--db PATH] [--json] [--all]`: the training runs in the run store, newest first.
// `tandem runs show ID [--json]`: one run with its settings, a summary of its metrics and its
// last events. Both first mark runs whose process is gone as interrupted, so a crashed run does
// not show as running forever.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "app/cli/commands.h"
#include "engine/core/error.h"
#include "engine/core/platform/local_time.h"
#include "engine/store/run_store.h"

namespace tandem::cli {

namespace {

namespace fs = std::filesystem;
using store::RunRecord;
using store::RunStore;
using store::StepMetrics;

constexpr size_t kNewestListed = 20;  // without --all
constexpr size_t kEventsShown = 10;
constexpr size_t kTextColumnMax = 32;  // model and dataset columns of the table

struct RunsOptions {
  std::string db;
  bool json = false;
  bool all = false;
  int64_t show_id = 0;
};

double nowS() {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count()) /
         1000.0;
}

std::string format(const char* fmt, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, value);
  return buf;
}

std::string formatDuration(double seconds) {
  if (seconds <= 0) return "-";
  const auto s = static_cast<int64_t>(seconds);
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm %02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else if (s < 86400) {
    std::snprintf(buf, sizeof(buf), "%lldh %02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldd %02lldh", static_cast<long long>(s / 86400),
                  static_cast<long long>(s % 86400 / 3600));
  }
  return buf;
}

std::string formatTime(std::optional<double> unix_s) {
  if (!unix_s) return "-";
  const auto t = static_cast<time_t>(*unix_s);
  const tm local = platform::localCalendarTime(t);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &local);
  return buf;
}

std::string formatLoss(std::optional<double> loss) {
  if (!loss) return "-";
  return std::isnan(*loss) ? "nan" : format("%.4f", *loss);
}

std::string formatSteps(const RunRecord& r) {
  std::string done = r.last_step ? std::to_string(*r.last_step) : "-";
  return r.total_steps > 0 ? done + "/" + std::to_string(r.total_steps) : done;
}

// Keeps the tail, which is the informative end of a model id or a dataset path.
std::string shorten(const std::string& text, size_t width) {
  if (text.size() <= width) return text.empty() ? "-" : text;
  return "..." + text.substr(text.size() - (width - 3));
}

nlohmann::json optionalJson(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);  // NaN dumps as null, too
}

nlohmann::json runJson(const RunRecord& r, double now_s, bool with_config) {
  nlohmann::json j = {
      {"id", r.id},
      {"name", r.name},
      {"status", std::string(store::runStatusName(r.status))},
      {"model", r.model},
      {"dataset", r.dataset},
      {"output_dir", r.output_dir.string()},
      {"config_fingerprint", r.config_fingerprint},
      {"pid", r.pid},
      {"host", r.host},
      {"created_at", r.created_at},
      {"started_at", optionalJson(r.started_at)},
      {"finished_at", optionalJson(r.finished_at)},
      {"updated_at", r.updated_at},
      {"duration_s", r.durationS(now_s)},
      {"total_steps", r.total_steps},
      {"last_step", r.last_step ? nlohmann::json(*r.last_step) : nlohmann::json(nullptr)},
      {"kind", store::runKindName(r.kind)},
      {"final_loss", optionalJson(r.final_loss)},
      {"error", r.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.error)},
  };
  if (with_config) j["config_yaml"] = r.config_yaml;
  return j;
}

void printTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const bool last = c + 1 == row.size();
      line += last ? row[c] : row[c] + std::string(widths[c] - row[c].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

fs::path databasePath(const RunsOptions& opts) {
  return opts.db.empty() ? RunStore::defaultPath() : fs::path(opts.db);
}

void listRuns(const RunsOptions& opts) {
  const fs::path path = databasePath(opts);
  if (!fs::exists(path)) {  // do not create a database just to say it is empty
    if (opts.json) {
      std::printf("[]\n");
    } else {
      std::printf("No runs yet (no run database at %s).\n", path.c_str());
    }
    return;
  }
  RunStore runs_db = RunStore::open(path);
  runs_db.markInterrupted();
  const std::vector<RunRecord> runs = runs_db.listRuns();
  const size_t shown = opts.all ? runs.size() : std::min(runs.size(), kNewestListed);
  const double now = nowS();
  if (opts.json) {
    nlohmann::json out = nlohmann::json::array();
    for (size_t i = 0; i < shown; ++i) out.push_back(runJson(runs[i], now, false));
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  if (runs.empty()) {
    std::printf("No runs yet in %s.\n", path.c_str());
    return;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "STATUS", "MODEL", "DATASET", "STEPS", "LOSS", "DURATION", "OUTPUT"}};
  for (size_t i = 0; i < shown; ++i) {
    const RunRecord& r = runs[i];
    rows.push_back(
        {std::to_string(r.id), std::string(store::runStatusName(r.status)),
         shorten(r.model, kTextColumnMax), shorten(r.dataset, kTextColumnMax), formatSteps(r),
         r.kind == store::RunKind::Eval ? "(eval)" : formatLoss(r.final_loss),
         formatDuration(r.durationS(now)), r.output_dir.empty() ? "-" : r.output_dir.string()});
  }
  printTable(rows);
  if (shown < runs.size()) {
    std::printf("(%zu newest of %zu runs; --all lists every run)\n", shown, runs.size());
  }
}

struct MetricsSummary {
  size_t count = 0;
  size_t nan_losses = 0;
  StepMetrics first;
  StepMetrics last;
  std::optional<StepMetrics> best;  // lowest finite loss
  std::optional<double> mean_tokens_per_s;
};

MetricsSummary summarize(const std::vector<StepMetrics>& rows) {
  MetricsSummary s;
  s.count = rows.size();
  if (rows.empty()) return s;
  s.first = rows.front();
  s.last = rows.back();
  double tokens_sum = 0;
  size_t tokens_n = 0;
  for (const StepMetrics& m : rows) {
    if (std::isnan(m.loss)) {
      ++s.nan_losses;
    } else if (!s.best || m.loss < s.best->loss) {
      s.best = m;
    }
    if (m.tokens_per_s) {
      tokens_sum += *m.tokens_per_s;
      ++tokens_n;
    }
  }
  if (tokens_n > 0) s.mean_tokens_per_s = tokens_sum / static_cast<double>(tokens_n);
  return s;
}

nlohmann::json summaryJson(const MetricsSummary& s) {
  if (s.count == 0) return {{"count", 0}};
  return {{"count", s.count},
          {"first_step", s.first.step},
          {"first_loss", s.first.loss},
          {"last_step", s.last.step},
          {"last_loss", s.last.loss},
          {"min_loss", s.best ? nlohmann::json(s.best->loss) : nlohmann::json(nullptr)},
          {"min_loss_step", s.best ? nlohmann::json(s.best->step) : nlohmann::json(nullptr)},
          {"nan_losses", s.nan_losses},
          {"mean_tokens_per_s", optionalJson(s.mean_tokens_per_s)},
          {"last_learning_rate", optionalJson(s.last.learning_rate)},
          {"last_grad_norm", optionalJson(s.last.grad_norm)},
          {"eta_s", optionalJson(s.last.eta_s)}};
}

void printField(const char* label, const std::string& value) {
  std::printf("  %-13s %s\n", label, value.c_str());
}

void printRun(const RunRecord& r, const MetricsSummary& s,
              const std::vector<store::RunEvent>& events, double now) {
  std::printf("Run %lld  %s  [%s]\n", static_cast<long long>(r.id),
              r.name.empty() ? "(unnamed)" : r.name.c_str(),
              std::string(store::runStatusName(r.status)).c_str());
  printField("model", r.model.empty() ? "-" : r.model);
  printField("dataset", r.dataset.empty() ? "-" : r.dataset);
  printField("output", r.output_dir.empty() ? "-" : r.output_dir.string());
  printField("config", r.config_fingerprint.empty() ? "-" : r.config_fingerprint);
  printField("process", "pid " + std::to_string(r.pid) + " on " + r.host);
  printField("created", formatTime(r.created_at));
  printField("started", formatTime(r.started_at));
  printField("finished", formatTime(r.finished_at));
  printField("duration", formatDuration(r.durationS(now)));
  printField("steps", formatSteps(r));
  printField("final loss", formatLoss(r.final_loss));
  if (!r.error.empty()) printField("error", r.error);

  std::printf("\nMetrics: %zu step(s) recorded\n", s.count);
  if (s.count > 0) {
    std::string loss =
        "first " + formatLoss(s.first.loss) + " (step " + std::to_string(s.first.step) + ")";
    if (s.best) {
      loss += ", min " + formatLoss(s.best->loss) + " (step " + std::to_string(s.best->step) + ")";
    }
    loss += ", last " + formatLoss(s.last.loss) + " (step " + std::to_string(s.last.step) + ")";
    printField("loss", loss);
    if (s.nan_losses > 0) printField("nan losses", std::to_string(s.nan_losses) + " step(s)");
    if (s.last.learning_rate) printField("lr", format("%.3g (last)", *s.last.learning_rate));
    if (s.last.grad_norm) printField("grad norm", format("%.4g (last)", *s.last.grad_norm));
    if (s.mean_tokens_per_s) {
      printField("throughput", format("%.0f tokens/s (mean)", *s.mean_tokens_per_s));
    }
    if (store::isLive(r.status) && s.last.eta_s) printField("eta", formatDuration(*s.last.eta_s));
  }

  std::printf("\nLast events:%s\n", events.empty() ? " none" : "");
  for (const store::RunEvent& e : events) {
    std::printf("  %s  %-12s %s\n", formatTime(e.time).c_str(), e.kind.c_str(), e.message.c_str());
  }
}

void showRun(const RunsOptions& opts) {
  const fs::path path = databasePath(opts);
  if (!fs::exists(path)) {
    throw Error("no run database at " + path.string(),
                "pass the right one with --db, or set TANDEM_HOME");
  }
  RunStore runs_db = RunStore::open(path);
  runs_db.markInterrupted();
  const std::optional<RunRecord> run = runs_db.findRun(opts.show_id);
  if (!run) {
    throw Error("no run " + std::to_string(opts.show_id) + " in " + path.string(),
                "list the runs with `tandem runs --all`");
  }
  const MetricsSummary summary = summarize(runs_db.metrics(run->id));
  const std::vector<store::RunEvent> events = runs_db.events(run->id, kEventsShown);
  const double now = nowS();
  if (opts.json) {
    nlohmann::json out = runJson(*run, now, true);
    out["metrics"] = summaryJson(summary);
    out["events"] = nlohmann::json::array();
    for (const store::RunEvent& e : events) {
      out["events"].push_back({{"time", e.time}, {"kind", e.kind}, {"message", e.message}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  printRun(*run, summary, events, now);
}

}  // namespace

void addRunsCommand(CLI::App& app) {
  auto opts = std::make_shared<RunsOptions>();
  auto* runs = app.add_subcommand(
      "runs", "List training runs, newest first (runs whose process died show as interrupted)");
  runs->add_option("--db", opts->db,
                   "Run database (default: $TANDEM_HOME/runs.db, else "
                   "~/.local/share/tandem/runs.db)");
  runs->add_flag("--json", opts->json, "Print JSON instead of text");
  runs->add_flag("--all", opts->all, "List every run, not only the 20 newest");

  auto* show = runs->add_subcommand("show", "Show one run: settings, metrics summary, last events");
  show->add_option("id", opts->show_id, "Run id, as listed by `tandem runs`")->required();
  show->fallthrough();  // `tandem runs show 3 --json --db x.db` works, too

  runs->callback([opts, show] {
    if (show->parsed()) {
      showRun(*opts);
    } else {
      listRuns(*opts);
    }
  });
}

}  // namespace tandem::cli
