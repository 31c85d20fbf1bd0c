#include "app/studio/screenshot_tour.h"

#include <QAbstractButton>
#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QImage>
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
#include "ui/machine_check_dialog.h"
#include "ui/main_window.h"
#include "ui/memory_map.h"
#include "ui/placement_editor.h"
#include "ui/runs_view.h"
#include "ui/settings_dialog.h"
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

void ScreenshotTour::shoot(QWidget& widget, const QString& name) {
  settle(300);
  const QImage image =
      widget.grab().toImage().convertToFormat(QImage::Format_Indexed8, Qt::ThresholdDither);
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "screenshot tour failed: %s\n", e.what());
    code = 1;
  }
  QApplication::exit(code);
}

}  // namespace tandem::studio
