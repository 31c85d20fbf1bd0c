// ui_stall_bench: how long the studio's event loop stalls while a fine-tune runs. The real
// dashboard (charts, memory map, log) is shown (offscreen) and fed by the real TrainingController
// while the demo model trains; a 5 ms precise QTimer records the gap between its ticks. Two
// baselines from the same run: the window idle, and the same training with no widget at all
// (what the engine's CPU load alone does to the GUI thread on this machine).
//
//   build/bin/ui_stall_bench [--steps N] [--idle-s S]
//
// Prints the longest gap beyond the 5 ms period, the 99th percentile and the tick count per
// phase, and the dashboard's ratio to the widget-less run; docs/benchmarks.md has the numbers.

#include <QApplication>
#include <QElapsedTimer>
#include <QEventLoop>
#include <QTemporaryDir>
#include <QTimer>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "engine/gpu/torch_runtime.h"
#include "engine/model/demo_model.h"
#include "engine/store/run_store.h"
#include "ui/machine_info.h"
#include "ui/resources.h"
#include "ui/training_controller.h"
#include "ui/training_dashboard.h"

namespace {

constexpr int kTickMs = 5;

struct Stalls {
  double max_ms = 0;
  double p99_ms = 0;
  size_t ticks = 0;
};

// Ticks a precise 5 ms timer until `done` says stop; returns the gaps beyond the 5 ms period.
class StallProbe {
 public:
  Stalls measure(const std::function<bool()>& done) {
    std::vector<double> late_ms;
    QTimer timer;
    timer.setTimerType(Qt::PreciseTimer);
    timer.setInterval(kTickMs);
    QElapsedTimer clock;
    clock.start();
    qint64 last_ns = clock.nsecsElapsed();
    QEventLoop loop;
    QObject::connect(&timer, &QTimer::timeout, &loop, [&] {
      const qint64 now_ns = clock.nsecsElapsed();
      late_ms.push_back(std::max(0.0, (now_ns - last_ns) / 1e6 - kTickMs));
      last_ns = now_ns;
      if (done()) loop.quit();
    });
    timer.start();
    loop.exec();
    Stalls s;
    s.ticks = late_ms.size();
    if (late_ms.empty()) return s;
    std::sort(late_ms.begin(), late_ms.end());
    s.max_ms = late_ms.back();
    s.p99_ms = late_ms[std::min(late_ms.size() - 1,
                                static_cast<size_t>(0.99 * static_cast<double>(late_ms.size())))];
    return s;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (!std::getenv("QT_QPA_PLATFORM")) setenv("QT_QPA_PLATFORM", "offscreen", 1);
  QApplication app(argc, argv);
  tandem::ui::initStudioResources();
  int steps = 30;
  double idle_s = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (key == "--idle-s")
      idle_s = std::atof(argv[i + 1]);
  }
  using namespace tandem;
  gpu::setTorchThreads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  QTemporaryDir tmp;
  const std::filesystem::path work = tmp.path().toStdString();
  const std::filesystem::path resources = TANDEM_RESOURCES_DIR;
  const model::DemoModel demo = model::ensureDemoModel(work / "demo", resources);
  train::TrainConfig config = train::loadTrainConfig(
      std::filesystem::path(TANDEM_PRESETS_DIR) / "training" / "demo_lora_sft.yaml",
      {"model_name_or_path=" + demo.dir.string(), "dataset_dir=" + (resources / "demo").string(),
       "output_dir=" + (work / "out").string(), "max_steps=" + std::to_string(steps),
       "logging_steps=1", "save_steps=" + std::to_string(std::max(1, steps / 2))});
  store::RunStore store = store::RunStore::open(work / "runs.db");
  const ui::MachineInfo machine = ui::detectMachine();
  StallProbe probe;

  // One training run under the probe; `with_dashboard` shows the real dashboard fed by it.
  int run_index = 0;
  auto measureTraining = [&](bool with_dashboard, ui::TrainFinish& finish, double& seconds) {
    ui::TrainingController controller(&store);
    std::unique_ptr<ui::TrainingDashboard> dashboard;
    if (with_dashboard) {
      dashboard = std::make_unique<ui::TrainingDashboard>(controller, machine);
      dashboard->resize(1200, 800);
      dashboard->show();
    }
    QApplication::processEvents();
    bool finished = false;
    QObject::connect(&controller, &ui::TrainingController::finished, [&](const ui::TrainFinish& f) {
      finished = true;
      finish = f;
    });
    train::TrainConfig run = config;
    run.output_dir = work / ("out" + std::to_string(run_index++));
    QElapsedTimer clock;
    clock.start();
    controller.start(run);
    const Stalls stalls = probe.measure([&] { return finished; });
    seconds = clock.elapsed() / 1000.0;
    return stalls;
  };

  ui::TrainingController idle_controller(&store);
  ui::TrainingDashboard idle_dashboard(idle_controller, machine);
  idle_dashboard.resize(1200, 800);
  idle_dashboard.show();
  QApplication::processEvents();
  QElapsedTimer idle_clock;
  idle_clock.start();
  const Stalls idle = probe.measure([&] { return idle_clock.elapsed() > idle_s * 1000; });
  idle_dashboard.hide();

  ui::TrainFinish bare_finish, finish;
  double bare_s = 0, train_s = 0;
  const Stalls bare = measureTraining(false, bare_finish, bare_s);
  const Stalls training = measureTraining(true, finish, train_s);
  for (const ui::TrainFinish* f : {&bare_finish, &finish}) {
    if (f->end != ui::TrainEnd::Completed) {
      std::fprintf(stderr, "training did not complete: %s\n", qPrintable(f->error));
      return 1;
    }
  }
  std::printf("event-loop stall, 5 ms precise timer, offscreen; %d demo steps per run\n", steps);
  std::printf("%-44s %10s %10s %8s %8s\n", "phase", "max ms", "p99 ms", "ticks", "run s");
  std::printf("%-44s %10.2f %10.2f %8zu %8s\n", "idle, dashboard shown (baseline)", idle.max_ms,
              idle.p99_ms, idle.ticks, "-");
  std::printf("%-44s %10.2f %10.2f %8zu %8.1f\n", "training, no widgets (engine load only)",
              bare.max_ms, bare.p99_ms, bare.ticks, bare_s);
  std::printf("%-44s %10.2f %10.2f %8zu %8.1f\n", "training, dashboard shown", training.max_ms,
              training.p99_ms, training.ticks, train_s);
  std::printf("ratio dashboard/no widgets: max %.2f, p99 %.2f\n",
              training.max_ms / std::max(1e-3, bare.max_ms),
              training.p99_ms / std::max(1e-3, bare.p99_ms));
  return 0;
}
