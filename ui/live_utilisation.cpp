#include "ui/live_utilisation.h"

#include <QLabel>
#include <QTimer>
#include <QVBoxLayout>

#include "engine/core/platform/gpu_telemetry.h"
#include "engine/core/system_load.h"
#include "engine/core/units.h"

namespace tandem::ui {
namespace {

QString rate(double bytes_per_second) {
  return QString::fromStdString(formatBytes(static_cast<uint64_t>(bytes_per_second))) +
         QStringLiteral("/s");
}

}  // namespace

LiveUtilisation::LiveUtilisation(QWidget* parent)
    : QWidget(parent), cpu_(std::make_unique<CpuLoadMeter>()) {
  label_ = new QLabel;
  label_->setObjectName(QStringLiteral("live_utilisation"));
  label_->setTextFormat(Qt::PlainText);
  label_->setAccessibleName(tr("Utilisation"));
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(label_);
  timer_ = new QTimer(this);
  timer_->setInterval(1000);
  connect(timer_, &QTimer::timeout, this, &LiveUtilisation::refresh);
}

LiveUtilisation::~LiveUtilisation() = default;

QString LiveUtilisation::text() const { return label_->text(); }

void LiveUtilisation::refresh() {
  QStringList lines;
  const std::vector<platform::GpuTelemetry> gpus = platform::readGpuTelemetry();
  for (const platform::GpuTelemetry& g : gpus) {
    QString line = tr("GPU %1 %2: %3 % busy, %4 of %5")
                       .arg(g.index)
                       .arg(QString::fromStdString(g.name))
                       .arg(g.utilisation_percent, 0, 'f', 0)
                       .arg(QString::fromStdString(formatBytes(g.memory_used_bytes)),
                            QString::fromStdString(formatBytes(g.memory_total_bytes)));
    if (g.power_watts > 0) line += tr(", %1 W").arg(g.power_watts, 0, 'f', 0);
    line += tr(", PCIe to GPU %1, from GPU %2")
                .arg(rate(g.pcie_rx_bytes_per_second), rate(g.pcie_tx_bytes_per_second));
    lines << line;
  }
  gpu_lines_ = static_cast<int>(gpus.size());
  QStringList nodes;
  for (const NodeLoad& n : cpu_->sample())
    nodes << tr("node %1 %2 %").arg(n.node).arg(n.busy_percent, 0, 'f', 0);
  lines << tr("CPU busy: %1").arg(nodes.join(QStringLiteral(", ")));
  label_->setText(lines.join(QLatin1Char('\n')));
}

void LiveUtilisation::showEvent(QShowEvent* event) {
  QWidget::showEvent(event);
  refresh();
  timer_->start();
}

void LiveUtilisation::hideEvent(QHideEvent* event) {
  timer_->stop();
  QWidget::hideEvent(event);
}

}  // namespace tandem::ui
