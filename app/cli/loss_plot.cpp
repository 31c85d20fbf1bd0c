#include "app/cli/loss_plot.h"

#ifdef TANDEM_CLI_WITH_QT
#include <QApplication>
#include <QtCharts/QChart>
#include <QtCharts/QChartView>
#include <QtCharts/QLineSeries>
#include <QtCharts/QValueAxis>
#endif

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/platform/environment.h"
#include "engine/core/platform/process_info.h"
#include "engine/io/bounded_json.h"
#include "engine/train/loss_smoothing.h"

namespace tandem::cli {

#ifdef TANDEM_CLI_WITH_QT
namespace {

QApplication& offscreenApp() {
  static int argc = 1;
  static char name[] = "tandem";
  static char* argv[] = {name, nullptr};
  if (std::getenv("QT_QPA_PLATFORM") == nullptr)
    platform::setEnvironmentVariable("QT_QPA_PLATFORM", "offscreen");
  // Qt warns on every start when XDG_RUNTIME_DIR is unset (servers, CI); give it a private one.
  if (std::getenv("XDG_RUNTIME_DIR") == nullptr) {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("tandem-runtime-" + platform::currentUserTag());
    std::filesystem::create_directories(dir);
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace);
    platform::setEnvironmentVariable("XDG_RUNTIME_DIR", dir.string().c_str());
  }
  static QApplication* app = qobject_cast<QApplication*>(QCoreApplication::instance())
                                 ? qobject_cast<QApplication*>(QCoreApplication::instance())
                                 : new QApplication(argc, argv);
  return *app;
}

}  // namespace

bool writeLossPlot(const std::filesystem::path& output_dir) {
  std::ifstream in(output_dir / "trainer_log.jsonl");
  std::vector<double> steps, losses;
  for (std::string line; std::getline(in, line);) {
    // A line cut short by a kill, a warning or eval line, a null (non-finite) loss: not plotted.
    const std::optional<nlohmann::json> j = io::tryParseBoundedJson(line, io::kStateJsonLimits);
    if (!j || !j->is_object() || !j->contains("loss") || !(*j)["loss"].is_number()) continue;
    const auto step = j->find("current_steps");
    steps.push_back(step != j->end() && step->is_number() ? step->get<double>() : 0.0);
    losses.push_back((*j)["loss"].get<double>());
  }
  if (losses.empty()) return false;
  offscreenApp();
  auto* chart = new QChart();
  auto* raw = new QLineSeries();
  auto* smoothed = new QLineSeries();
  raw->setName("original");
  smoothed->setName("smoothed");
  const std::vector<double> smooth_losses = train::smoothLoss(losses);
  for (size_t i = 0; i < losses.size(); ++i) {
    raw->append(steps[i], losses[i]);
    smoothed->append(steps[i], smooth_losses[i]);
  }
  QPen light(QColor(31, 119, 180, 90));
  light.setWidthF(1.5);
  raw->setPen(light);
  QPen strong(QColor(31, 119, 180));
  strong.setWidthF(2.5);
  smoothed->setPen(strong);
  chart->addSeries(raw);
  chart->addSeries(smoothed);
  chart->createDefaultAxes();
  chart->axes(Qt::Horizontal).first()->setTitleText("step");
  chart->axes(Qt::Vertical).first()->setTitleText("loss");
  chart->setTitle(QString::fromStdString("training loss of " + output_dir.filename().string()));
  QChartView view(chart);  // takes ownership of the chart
  view.setRenderHint(QPainter::Antialiasing);
  view.resize(960, 600);
  const std::filesystem::path tmp = output_dir / ".training_loss.png.tmp";
  if (!view.grab().save(QString::fromStdString(tmp.string()), "PNG")) {
    throw Error("could not write " + tmp.string());
  }
  std::filesystem::rename(tmp, output_dir / "training_loss.png");
  return true;
}
#else
bool writeLossPlot(const std::filesystem::path&) { return false; }
#endif

}  // namespace tandem::cli
