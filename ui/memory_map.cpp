#include "ui/memory_map.h"

#include <QEvent>
#include <QHelpEvent>
#include <QPainter>
#include <QToolTip>
#include <algorithm>

#include "engine/placement/memory_planner.h"
#include "ui/machine_info.h"

namespace tandem::ui {

namespace {

constexpr int kBarHeight = 22;
constexpr int kRowGap = 8;
constexpr int kLegendHeight = 22;

void addLedger(MemoryBar& bar, const DeviceMemoryUsage& usage) {
  for (int c = 0; c < kMemoryCategoryCount; ++c) bar.bytes[c] += usage.current_bytes[c];
}

uint64_t ledgerSum(const MemoryBar& bar) {
  uint64_t sum = 0;
  for (int c = 0; c < kMemoryCategoryCount; ++c) sum += bar.bytes[c];
  return sum;
}

}  // namespace

QString memorySliceName(MemorySlice slice) {
  switch (slice) {
    case MemorySlice::Weights: return QObject::tr("weights");
    case MemorySlice::Lora: return QObject::tr("LoRA");
    case MemorySlice::Optimizer: return QObject::tr("optimizer");
    case MemorySlice::Activations: return QObject::tr("activations");
    case MemorySlice::Cache: return QObject::tr("KV/cache");
    case MemorySlice::Scratch: return QObject::tr("scratch");
    case MemorySlice::Other: return QObject::tr("other (not in the ledger)");
    case MemorySlice::Free: return QObject::tr("free");
  }
  return {};
}

QColor memorySliceColor(MemorySlice slice) {
  switch (slice) {
    case MemorySlice::Weights: return QColor(0, 114, 178);
    case MemorySlice::Lora: return QColor(213, 94, 0);
    case MemorySlice::Optimizer: return QColor(204, 121, 167);
    case MemorySlice::Activations: return QColor(0, 158, 115);
    case MemorySlice::Cache: return QColor(230, 159, 0);
    case MemorySlice::Scratch: return QColor(86, 180, 233);
    case MemorySlice::Other: return QColor(150, 150, 150);
    case MemorySlice::Free: return QColor(235, 235, 235);
  }
  return {};
}

uint64_t MemoryBar::used() const {
  uint64_t sum = 0;
  for (int s = 0; s < kMemorySliceCount; ++s) {
    if (s != static_cast<int>(MemorySlice::Free)) sum += bytes[s];
  }
  return sum;
}

std::vector<MemoryBar> liveMemoryBars(const MachineInfo& machine,
                                      const std::vector<DeviceMemoryUsage>& ledger) {
  std::vector<MemoryBar> bars;
  for (const gpu::GpuInfo& g : machine.torch.gpus) {
    MemoryBar bar;
    bar.device = QStringLiteral("cuda:%1").arg(g.index);
    bar.label = QStringLiteral("GPU %1").arg(g.index);
    bar.capacity_bytes = g.total_bytes;
    bars.push_back(bar);
  }
  const NumaTopology numa = detectNumaTopology();  // free RAM now
  for (const NumaNode& n : numa.nodes) {
    MemoryBar bar;
    bar.device = QStringLiteral("cpu:numa%1").arg(n.id);
    bar.label = numa.nodes.size() == 1 ? QObject::tr("RAM") : QObject::tr("RAM node %1").arg(n.id);
    bar.capacity_bytes = n.total_bytes;
    bar.bytes[static_cast<int>(MemorySlice::Free)] = n.free_bytes;
    bars.push_back(bar);
  }
  for (const DeviceMemoryUsage& usage : ledger) {
    QString device = QString::fromStdString(usage.device);
    if (device == QStringLiteral("cpu") && numa.nodes.size() == 1)
      device = QStringLiteral("cpu:numa%1").arg(numa.nodes[0].id);
    auto it = std::find_if(bars.begin(), bars.end(),
                           [&](const MemoryBar& b) { return b.device == device; });
    if (it == bars.end()) {
      MemoryBar bar;
      bar.device = device;
      bar.label = device;
      bar.capacity_bytes =
          device.startsWith(QStringLiteral("cpu")) ? numa.totalBytes() : usage.currentTotal();
      bars.push_back(bar);
      it = bars.end() - 1;
    }
    addLedger(*it, usage);
  }
  for (MemoryBar& bar : bars) {
    const uint64_t engine = ledgerSum(bar);
    uint64_t& free = bar.bytes[static_cast<int>(MemorySlice::Free)];
    if (bar.device.startsWith(QStringLiteral("cpu:numa"))) {
      // The system says what is free; what is used beyond the engine's own accounts is "other".
      const uint64_t used = bar.capacity_bytes > free ? bar.capacity_bytes - free : 0;
      bar.bytes[static_cast<int>(MemorySlice::Other)] = used > engine ? used - engine : 0;
    } else {
      free = bar.capacity_bytes > engine ? bar.capacity_bytes - engine : 0;
    }
  }
  return bars;
}

std::vector<MemoryBar> plannedMemoryBars(const placement::MemoryPlan& plan) {
  using placement::PlanCategory;
  auto slice = [](PlanCategory c) {
    switch (c) {
      case PlanCategory::Weights:
      case PlanCategory::PackedTransposed: return MemorySlice::Weights;
      case PlanCategory::LoraOptimizer: return MemorySlice::Lora;
      case PlanCategory::Activations:
      case PlanCategory::ExpertCache: return MemorySlice::Activations;
      case PlanCategory::KvCache: return MemorySlice::Cache;
      case PlanCategory::PinnedStaging:
      case PlanCategory::Overhead: return MemorySlice::Scratch;
    }
    return MemorySlice::Scratch;
  };
  std::vector<MemoryBar> bars;
  for (const placement::DevicePlan& d : plan.devices) {
    MemoryBar bar;
    bar.device = QString::fromStdString(d.device.str());
    bar.label = d.device.isGpu() ? QStringLiteral("GPU %1").arg(d.device.gpuIndex())
                                 : QObject::tr("RAM %1").arg(bar.device.mid(3));
    bar.capacity_bytes = d.capacity_bytes;
    for (int c = 0; c < placement::kPlanCategoryCount; ++c) {
      bar.bytes[static_cast<int>(slice(static_cast<PlanCategory>(c)))] += d.bytes[c];
    }
    bar.bytes[static_cast<int>(MemorySlice::Free)] =
        d.capacity_bytes > d.total() ? d.capacity_bytes - d.total() : 0;
    QStringList lines;
    for (const placement::PlanItem& item : d.items) {
      lines << QStringLiteral("%1: %2").arg(QString::fromStdString(item.what),
                                            bytesText(item.bytes));
    }
    bar.details = lines.join(QLatin1Char('\n'));
    bars.push_back(bar);
  }
  return bars;
}

MemoryMapWidget::MemoryMapWidget(QWidget* parent) : QWidget(parent) {
  setMouseTracking(true);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Minimum);
  setAccessibleName(tr("Memory map"));
}

void MemoryMapWidget::setBars(std::vector<MemoryBar> bars) {
  bars_ = std::move(bars);
  updateGeometry();
  update();
}

int MemoryMapWidget::labelWidth() const {
  int width = 60;
  for (const MemoryBar& b : bars_)
    width = std::max(width, fontMetrics().horizontalAdvance(b.label) + 12);
  return width;
}

QSize MemoryMapWidget::sizeHint() const {
  const int rows = std::max<int>(1, static_cast<int>(bars_.size()));
  return {480, rows * (kBarHeight + kRowGap) + kLegendHeight + 4};
}

QSize MemoryMapWidget::minimumSizeHint() const { return {240, sizeHint().height()}; }

QRect MemoryMapWidget::barRect(int index) const {
  const int left = labelWidth();
  const int right_text =
      fontMetrics().horizontalAdvance(QStringLiteral("000.0 GiB / 000.0 GiB")) + 10;
  return {left, index * (kBarHeight + kRowGap), std::max(40, width() - left - right_text),
          kBarHeight};
}

void MemoryMapWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.setRenderHint(QPainter::Antialiasing, false);
  const QColor text = palette().color(QPalette::WindowText);
  if (bars_.empty()) {
    p.setPen(text);
    p.drawText(rect(), Qt::AlignCenter, tr("no memory figures yet"));
    return;
  }
  for (int i = 0; i < static_cast<int>(bars_.size()); ++i) {
    const MemoryBar& bar = bars_[i];
    const QRect r = barRect(i);
    p.setPen(text);
    p.drawText(QRect(0, r.top(), r.left() - 6, r.height()), Qt::AlignRight | Qt::AlignVCenter,
               bar.label);
    const double capacity = static_cast<double>(std::max<uint64_t>(1, bar.capacity_bytes));
    double x = r.left();
    for (int s = 0; s < kMemorySliceCount; ++s) {
      if (bar.bytes[s] == 0) continue;
      // A slice too small to see still gets 2 px, so "there is some" shows.
      const double w = std::max(2.0, r.width() * static_cast<double>(bar.bytes[s]) / capacity);
      p.fillRect(QRectF(x, r.top(), std::min(w, r.right() + 1 - x), r.height()),
                 memorySliceColor(static_cast<MemorySlice>(s)));
      x += w;
    }
    p.setPen(palette().color(QPalette::Mid));
    p.drawRect(r.adjusted(0, 0, -1, -1));
    p.setPen(text);
    p.drawText(QRect(r.right() + 8, r.top(), width() - r.right() - 8, r.height()),
               Qt::AlignLeft | Qt::AlignVCenter,
               tr("%1 / %2").arg(bytesText(bar.used()), bytesText(bar.capacity_bytes)));
  }
  // Legend.
  int x = labelWidth();
  const int y = static_cast<int>(bars_.size()) * (kBarHeight + kRowGap) + 4;
  for (int s = 0; s < kMemorySliceCount; ++s) {
    const QString name = memorySliceName(static_cast<MemorySlice>(s));
    p.fillRect(QRect(x, y + 4, 12, 12), memorySliceColor(static_cast<MemorySlice>(s)));
    p.setPen(palette().color(QPalette::Mid));
    p.drawRect(QRect(x, y + 4, 11, 11));
    p.setPen(text);
    p.drawText(QPoint(x + 16, y + 15), name);
    x += 16 + fontMetrics().horizontalAdvance(name) + 14;
  }
}

QString MemoryMapWidget::detailsAt(const QPoint& pos) const {
  for (int i = 0; i < static_cast<int>(bars_.size()); ++i) {
    const QRect r = barRect(i);
    if (!r.contains(pos)) continue;
    const MemoryBar& bar = bars_[i];
    const double capacity = static_cast<double>(std::max<uint64_t>(1, bar.capacity_bytes));
    double x = r.left();
    for (int s = 0; s < kMemorySliceCount; ++s) {
      if (bar.bytes[s] == 0) continue;
      const double w = std::max(2.0, r.width() * static_cast<double>(bar.bytes[s]) / capacity);
      if (pos.x() >= x && pos.x() < x + w) {
        return tr("%1 — %2: %3 (%4% of %5)")
                   .arg(bar.device, memorySliceName(static_cast<MemorySlice>(s)),
                        bytesText(bar.bytes[s]))
                   .arg(100.0 * static_cast<double>(bar.bytes[s]) / capacity, 0, 'f', 1)
                   .arg(bytesText(bar.capacity_bytes)) +
               (bar.details.isEmpty() ? QString() : QStringLiteral("\n") + bar.details);
      }
      x += w;
    }
    return tr("%1: %2 used of %3")
               .arg(bar.device, bytesText(bar.used()), bytesText(bar.capacity_bytes)) +
           (bar.details.isEmpty() ? QString() : QStringLiteral("\n") + bar.details);
  }
  return {};
}

bool MemoryMapWidget::event(QEvent* event) {
  if (event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    const QString text = detailsAt(help->pos());
    if (text.isEmpty())
      QToolTip::hideText();
    else
      QToolTip::showText(help->globalPos(), text, this);
    return true;
  }
  return QWidget::event(event);
}

}  // namespace tandem::ui
