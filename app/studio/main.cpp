// tandem-studio: the desktop workstation app. main only reads the command line, finds the bundled
// files and shows the main window; everything else lives in ui/.

#include <QApplication>
#include <QCommandLineParser>
#include <QMessageBox>
#include <QTimer>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "app/studio/screenshot_tour.h"
#include "engine/core/error.h"
#include "engine/core/install_layout.h"
#include "engine/core/process_tuning.h"
#include "engine/gpu/torch_runtime.h"
#include "ui/engine_worker.h"
#include "ui/main_window.h"
#include "ui/resources.h"

int main(int argc, char** argv) {
  tandem::tuneOpenMpWaitAndMalloc(argv);  // before Qt or libtorch start any thread
  QApplication app(argc, argv);
  tandem::ui::initStudioResources();
  QCoreApplication::setOrganizationName(QStringLiteral("Tandem"));
  QCoreApplication::setApplicationName(QStringLiteral("Tandem Studio"));
  QCoreApplication::setApplicationVersion(QStringLiteral(TANDEM_VERSION));

  QCommandLineParser parser;
  parser.setApplicationDescription(
      QStringLiteral("LoRA fine-tuning of MoE language models on one machine"));
  parser.addHelpOption();
  parser.addVersionOption();
  const QCommandLineOption tour(
      QStringLiteral("screenshot-tour"),
      QStringLiteral("Walk every page with the demo, save screenshots to DIR, quit"),
      QStringLiteral("DIR"));
  const QCommandLineOption tour_steps(
      QStringLiteral("tour-steps"),
      QStringLiteral("Optimizer steps of the tour's demo fine-tune (default 24)"),
      QStringLiteral("N"), QStringLiteral("24"));
  parser.addOption(tour);
  parser.addOption(tour_steps);
  parser.process(app);

  // As `tandem demo`: libtorch gets every core (the expert engine has its own pool).
  tandem::gpu::setTorchThreads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  tandem::ui::StudioPaths paths;
  try {
    paths.resources = tandem::resourcesDir();
    paths.presets = tandem::presetsDir();
  } catch (const tandem::Error& e) {
    QMessageBox::critical(nullptr, QStringLiteral("Tandem Studio cannot start"),
                          QString::fromStdString(e.message() + "\n\n" + e.whatToDo()));
    return 1;
  }
  const tandem::ui::StudioSettings settings = tandem::ui::StudioSettings::load();
  paths.demo_workdir = settings.demo_workdir.toStdString();

  int code = 0;
  {
    tandem::ui::MainWindow window(settings, paths);
    window.show();
    std::unique_ptr<tandem::studio::ScreenshotTour> screenshot_tour;
    if (parser.isSet(tour)) {
      screenshot_tour = std::make_unique<tandem::studio::ScreenshotTour>(
          window, parser.value(tour), std::max(2, parser.value(tour_steps).toInt()));
      QTimer::singleShot(0, screenshot_tour.get(), &tandem::studio::ScreenshotTour::run);
    }
    code = app.exec();
  }
  // The window is gone (run store closed, settings saved), but a machine probe or a data read it
  // stopped waiting for may still run: the engine's static state must not be destroyed under it.
  if (tandem::ui::EngineWorker::abandonedCalls() > 0) {
    std::fflush(nullptr);
    std::quick_exit(code);
  }
  return code;
}
