#include "app/studio/screenshot_tour.h"

#include <QAbstractButton>
#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QImage>
#include <QSlider>
#include <QTabWidget>
#include <QThread>
#include <QTimer>
#include <cstdio>
#include <functional>
#include <stdexcept>

#include "engine/core/error.h"
#include "engine/train/training_plan.h"
#include "ui/chat_controller.h"
#include "ui/chat_panel.h"
#include "ui/error_text.h"
#include "ui/export_dialog.h"
#include "ui/last_run.h"
#include "ui/machine_check_dialog.h"
#include "ui/main_window.h"
#include "ui/memory_map.h"
#include "ui/placement_board.h"
#include "ui/placement_board_model.h"
#include "ui/placement_editor.h"
#include "ui/runs_view.h"
#include "ui/settings_dialog.h"
#include "ui/theme.h"
#include "ui/training_controller.h"
#include "ui/training_dashboard.h"
#include "ui/wizard_pages.h"

namespace tandem::studio {

namespace {

struct TourFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

ScreenshotTour::ScreenshotTour(ui::MainWindow& window, QString dir, int steps)
    : window_(window),
      dir_(std::move(dir)),
      steps_(steps),
      work_(QDir::temp().filePath(QStringLiteral("tandem-tour-XXXXXX"))) {}

void ScreenshotTour::settle(int ms) {
  QElapsedTimer timer;
  timer.start();
  while (timer.elapsed() < ms) QApplication::processEvents(QEventLoop::AllEvents, 20);
}

void ScreenshotTour::waitFor(const std::function<bool()>& done, int timeout_ms,
                             const QString& what) {
  QElapsedTimer timer;
  timer.start();
  while (!done()) {
    if (timer.elapsed() > timeout_ms)
      throw TourFailed(("timed out waiting for " + what).toStdString());
    QApplication::processEvents(QEventLoop::AllEvents, 50);
    QThread::msleep(10);
  }
}

// 8-bit palette PNGs: UI screenshots have few colours, and the files stay a fraction of the size.
void ScreenshotTour::shoot(const QString& name) { shoot(window_, name); }

void ScreenshotTour::shoot(QWidget& widget, const QString& name, bool full_colour) {
  settle(300);
  const QImage grabbed = widget.grab().toImage();
  const QImage image = full_colour
                           ? grabbed.convertToFormat(QImage::Format_RGB888)
                           : grabbed.convertToFormat(QImage::Format_Indexed8, Qt::ThresholdDither);
  const QString path = QDir(dir_).filePath(name + QStringLiteral(".png"));
  if (!image.save(path, "PNG", 9)) throw TourFailed(("could not write " + path).toStdString());
  std::printf("saved %s\n", qPrintable(path));
}

void ScreenshotTour::run() {
  int code = 0;
  try {
    QDir().mkpath(dir_);
    window_.resize(1280, 800);
    ui::FineTuneWizard* wizard = window_.wizard();
    train::TrainConfig config = ui::demoConfig(wizard->paths(), work_.path().toStdString());
    config.max_steps = steps_;
    config.save_steps = std::max(1, steps_ / 2);
    config.logging_steps = 1;
    wizard->loadConfig(config);
    wizard->restart();
    window_.showTab(ui::MainWindow::WizardTab);
    const char* pages[] = {"1-wizard-model", "2-wizard-hardware", "3-wizard-dataset",
                           "4-wizard-training", "5-wizard-review"};
    auto filled = [&] {
      waitFor([&] { return !wizard->isBusy(); }, 120000, QStringLiteral("the wizard's results"));
    };
    for (int i = 0; i < 5; ++i) {
      filled();
      if (i > 0) {
        if (!wizard->currentPage()->isComplete()) {
          throw TourFailed("wizard page " + std::to_string(i) +
                           " does not accept the demo settings");
        }
        wizard->next();
        filled();
      }
      shoot(QString::fromLatin1(pages[i]));
    }
    if (!wizard->currentPage()->isComplete())
      throw TourFailed("the review page refuses the demo config");
    {
      const train::TrainConfig current = wizard->config();
      ui::PlacementEditor editor(train::planRequestFor(current, wizard->modelSummary()->config),
                                 wizard->hardware(), {}, &window_);
      editor.show();
      shoot(editor, QStringLiteral("5b-placement-editor"));
    }
    {
      // The board as it looks for a two-GPU, two-node workstation (a hardware preset, as the
      // wizard's hardware page offers), after a few edits: every layer keeps 4 experts on its
      // GPU, layer 2 keeps 12, layer 1 is dragged to NUMA node 0.
      const train::TrainConfig current = wizard->config();
      const placement::Hardware workstation = placement::resolveHardware(
          "2x4090-24g_xeon-spr-2s_512g", wizard->paths().presets / "hardware");
      ui::PlacementBoard board(train::planRequestFor(current, wizard->modelSummary()->config),
                               workstation, {}, &window_);
      board.globalSlider()->setValue(4);
      if (QSlider* layer2 = board.layerSlider(2)) layer2->setValue(12);
      ui::PlacementBoardModel* model = board.model();
      model->move({model->layerRow(1)}, ui::PlacementBoardModel::Part::Dense,
                  placement::Device::numaNode(0));
      board.show();
      shoot(board, QStringLiteral("13-placement-board"));
    }
    wizard->button(QWizard::FinishButton)->click();
    ui::TrainingController* training = window_.trainingController();
    const int half = std::max(1, steps_ / 2);
    waitFor([&] { return window_.dashboard()->pointsReceived() >= half || !training->isRunning(); },
            600000, QStringLiteral("training steps"));
    shoot(QStringLiteral("6-training-live"));
    {
      // The dashboard's memory map as it is mid-run, at a size where its columns read well.
      const ui::MemoryMapWidget& live = *window_.dashboard()->memoryMap();
      ui::MemoryMapWidget map;
      map.setCaption(live.caption());
      map.setBars(live.bars());
      map.resize(960, 440);
      map.show();
      shoot(map, QStringLiteral("12-memory-map"));
    }
    waitFor([&] { return !training->isRunning(); }, 600000, QStringLiteral("the end of the run"));
    shoot(QStringLiteral("7-training-done"));
    if (window_.dashboard()->pointsReceived() < steps_)
      throw TourFailed("the run ended before its last step");

    window_.showTab(ui::MainWindow::RunsTab);
    window_.runsView()->refresh();
    if (window_.runsView()->runCount() == 0) throw TourFailed("the run is not in the history");
    window_.runsView()->selectRuns({window_.runsView()->runs().front().id});
    shoot(QStringLiteral("8-runs"));

    window_.showTab(ui::MainWindow::ChatTab);
    window_.chatPanel()->setQuestion(QStringLiteral("Who are you?"));
    window_.chatPanel()->setSampling(false);  // greedy: the same answer on every tour
    window_.chatPanel()->send();
    ui::ChatController* chat = window_.chatController();
    waitFor([&] { return !chat->isBusy(); }, 300000, QStringLiteral("the chat answers"));
    if (window_.chatPanel()->answer(1).isEmpty()) throw TourFailed("the adapter gave no answer");
    shoot(QStringLiteral("9-chat"));

    ui::SettingsDialog settings(window_.settings(), &window_);
    settings.show();
    shoot(settings, QStringLiteral("10-settings"));
    settings.close();

    ui::MachineCheckDialog doctor(window_.settings().output_parent, &window_);
    doctor.show();
    waitFor([&] { return !doctor.isChecking(); }, 120000, QStringLiteral("the machine check"));
    if (!doctor.report()) throw TourFailed("the machine check gave no report");
    shoot(doctor, QStringLiteral("11-machine-check"));

    shootPreferences();
    shootExportDialog();
  } catch (const std::exception& e) {
    ui::applyTheme(window_.settings().theme);
    std::fprintf(stderr, "screenshot tour failed: %s\n", e.what());
    code = 1;
  }
  QApplication::exit(code);
}

// A second run from the last run's settings (as the wizard pre-fills them) with twice the
// learning rate and another LoRA rank; the runs page compares the two; the preferences; the
// comparison again in the dark palette.
void ScreenshotTour::shootPreferences() {
  if (!window_.runStore()) throw TourFailed("no run store is open");
  std::optional<train::TrainConfig> again = ui::lastRunConfig(*window_.runStore());
  if (!again) throw TourFailed("the last run's settings are not in the history");
  again->learning_rate *= 2;
  again->lora_rank = std::max<int64_t>(1, again->lora_rank / 2);
  window_.startTraining(*again);
  waitFor([&] { return !window_.trainingController()->isRunning(); }, 600000,
          QStringLiteral("the second run"));
  window_.showTab(ui::MainWindow::RunsTab);
  ui::RunsView* runs = window_.runsView();
  runs->refresh();
  if (runs->runCount() < 2) throw TourFailed("the second run is not in the history");
  runs->selectRuns({runs->runs()[0].id, runs->runs()[1].id});
  shoot(QStringLiteral("15-run-compare"));

  ui::SettingsDialog preferences(window_.settings(), &window_);
  preferences.show();
  shoot(preferences, QStringLiteral("16-preferences"));
  preferences.close();

  ui::applyTheme(ui::ThemeChoice::Dark);
  shoot(window_, QStringLiteral("16b-dark-palette"), true);
  ui::applyTheme(window_.settings().theme);
}

// The runs page's Export… dialog after a real merged export of the tour's run.
void ScreenshotTour::shootExportDialog() {
  window_.showTab(ui::MainWindow::RunsTab);
  const train::TrainConfig run = ui::RunsView::resumeConfig(window_.runsView()->runs().front());
  ui::ExportDialog exporter(QString::fromStdString(run.model_name_or_path),
                            QString::fromStdString(run.output_dir.string()),
                            QString::fromStdString(run.template_name), &window_);
  exporter.setOutput(work_.filePath(QStringLiteral("export-merged-hf")));
  exporter.show();
  exporter.startExport();
  waitFor([&] { return !exporter.running(); }, 300000, QStringLiteral("the export"));
  if (exporter.written().empty()) throw TourFailed("the export wrote nothing");
  shoot(exporter, QStringLiteral("14-export"));
}

}  // namespace tandem::studio
