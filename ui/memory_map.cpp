#include "ui/memory_map.h"

#include <QEvent>
#include <QHelpEvent>
#include <QPainter>
#include <QToolTip>
#include <algorithm>

#include "engine/placement/memory_planner.h"
#include "ui/machine_info.h"
#include "ui/theme.h"

namespace tandem::ui {

namespace {

constexpr int kMaxColumnWidth = 56;
constexpr int kGroupGap = 18;
constexpr int kSwatch = 11;

// Slice rectangles of a column stacked bottom-up in slice order, `capacity` = the column's
// height. A slice too small to see still gets 2 px, so "there is some" shows.
std::array<QRectF, kMemorySliceCount> sliceRects(
    const QRect& r, const std::array<uint64_t, kMemorySliceCount>& bytes, uint64_t capacity) {
  std::array<QRectF, kMemorySliceCount> rects{};
  const double scale = r.height() / static_cast<double>(std::max<uint64_t>(1, capacity));
  double bottom = r.bottom() + 1;
  for (int s = 0; s < kMemorySliceCount; ++s) {
    if (bytes[s] == 0) continue;
    const double h =
        std::min(std::max(2.0, static_cast<double>(bytes[s]) * scale), bottom - r.top());
    if (h <= 0) continue;
    rects[s] = QRectF(r.left(), bottom - h, r.width(), h);
    bottom -= h;
  }
  return rects;
}

bool anyBar(const std::vector<MemoryBar>& bars, bool gpu) {
  return std::any_of(bars.begin(), bars.end(), [&](const MemoryBar& b) { return b.gpu == gpu; });
}

}  // namespace

QColor memorySliceColor(MemorySlice slice, const QPalette& palette) {
  switch (slice) {
    case MemorySlice::Weights: return QColor(0, 114, 178);
    case MemorySlice::Lora: return QColor(213, 94, 0);
    case MemorySlice::Optimizer: return QColor(204, 121, 167);
    case MemorySlice::Activations: return QColor(0, 158, 115);
    case MemorySlice::Cache: return QColor(230, 159, 0);
    case MemorySlice::Scratch: return QColor(86, 180, 233);
    case MemorySlice::Untracked: return QColor(120, 190, 150);
    case MemorySlice::Other: return QColor(150, 150, 150);
    case MemorySlice::Free: return isDark(palette) ? QColor(72, 72, 72) : QColor(235, 235, 235);
  }
  return {};
}

MemoryMapWidget::MemoryMapWidget(QWidget* parent) : QWidget(parent) {
  setMouseTracking(true);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
  setAccessibleName(tr("Memory map"));
}

void MemoryMapWidget::setBars(std::vector<MemoryBar> bars) {
  bars_ = std::move(bars);
  updateGeometry();
  update();
}

void MemoryMapWidget::showSnapshot(const MemorySnapshot& snapshot) {
  std::vector<MemoryBar> bars = liveMemoryBars(snapshot);
  if (plan_) attachPlan(bars, *plan_);
  setCaption(snapshot.phase == "step"
                 ? tr("Measured after step %1").arg(snapshot.step)
                 : tr("Measured: %1").arg(QString::fromStdString(snapshot.phase)));
  setBars(std::move(bars));
}

void MemoryMapWidget::setPlan(std::shared_ptr<const placement::MemoryPlan> plan) {
  plan_ = std::move(plan);
}

void MemoryMapWidget::setCaption(const QString& caption) {
  caption_ = caption;
  update();
}

QSize MemoryMapWidget::sizeHint() const {
  const int columns = std::max<int>(1, static_cast<int>(bars_.size()));
  return {std::max(360, columns * (2 * kMaxColumnWidth + kGroupGap)), 260};
}

QSize MemoryMapWidget::minimumSizeHint() const { return {240, 180}; }

std::vector<MemoryMapWidget::LegendEntry> MemoryMapWidget::legendEntries() const {
  const bool gpu = anyBar(bars_, true), host = anyBar(bars_, false);
  std::vector<LegendEntry> entries;
  for (int s = 0; s < kMemorySliceCount; ++s) {
    const auto slice = static_cast<MemorySlice>(s);
    QString name = memorySliceName(slice, gpu && !host);
    if (gpu && host && memorySliceName(slice, true) != memorySliceName(slice, false))
      name = memorySliceName(slice, true) + QStringLiteral(" / ") + memorySliceName(slice, false);
    entries.push_back({QBrush(memorySliceColor(slice, palette())), name});
  }
  if (std::any_of(bars_.begin(), bars_.end(), [](const MemoryBar& b) { return b.has_plan; }))
    entries.push_back(
        {QBrush(palette().color(QPalette::WindowText), Qt::Dense3Pattern), tr("plan (beside)")});
  return entries;
}

// Where each legend entry goes: left to right, wrapping over the width. Rows start at y = 0.
std::vector<QPoint> MemoryMapWidget::legendPositions(const std::vector<LegendEntry>& entries,
                                                     int* rows) const {
  const int line = fontMetrics().height() + 4;
  std::vector<QPoint> at;
  int x = 8, y = 0;
  for (const LegendEntry& e : entries) {
    const int w = kSwatch + 6 + fontMetrics().horizontalAdvance(e.name) + 14;
    if (x + w > width() && x > 8) {
      x = 8;
      y += line;
    }
    at.emplace_back(x, y);
    x += w;
  }
  if (rows) *rows = y / line + 1;
  return at;
}

int MemoryMapWidget::legendHeight() const {
  int rows = 1;
  legendPositions(legendEntries(), &rows);
  return rows * (fontMetrics().height() + 4) + 4;
}

QRect MemoryMapWidget::plotArea() const {
  const int line = fontMetrics().height() + 2;
  const int top = (caption_.isEmpty() ? 0 : line + 2) + line;  // caption, then the totals
  const int bottom = 2 * line + legendHeight();                // labels (two lines), legend
  return QRect(8, top, std::max(40, width() - 16), std::max(20, height() - top - bottom));
}

MemoryMapWidget::Column MemoryMapWidget::columnAt(int index) const {
  const QRect area = plotArea();
  const int n = std::max<int>(1, static_cast<int>(bars_.size()));
  const int group = area.width() / n;
  const MemoryBar& bar = bars_[static_cast<size_t>(index)];
  const int w = std::clamp((group - kGroupGap) * 5 / 8, 8, kMaxColumnWidth);
  const int plan_w = bar.has_plan ? std::max(5, w * 3 / 5) : 0;
  const int left = area.left() + index * group + (group - w - plan_w - (plan_w ? 3 : 0)) / 2;
  Column c;
  c.measured = QRect(left, area.top(), w, area.height());
  if (bar.has_plan) c.planned = QRect(left + w + 3, area.top(), plan_w, area.height());
  return c;
}

void MemoryMapWidget::paintStack(QPainter& p, const QRect& r, const MemoryBar& bar,
                                 const std::array<uint64_t, kMemorySliceCount>& bytes,
                                 bool plan) const {
  const auto rects = sliceRects(r, bytes, bar.capacity_bytes);
  for (int s = 0; s < kMemorySliceCount; ++s) {
    if (rects[s].isEmpty()) continue;
    const QColor color = memorySliceColor(static_cast<MemorySlice>(s), palette());
    p.fillRect(rects[s], plan ? QBrush(color, Qt::Dense3Pattern) : QBrush(color));
  }
  p.setPen(palette().color(QPalette::Mid));
  p.drawRect(r.adjusted(0, 0, -1, -1));
}

void MemoryMapWidget::paintLegend(QPainter& p) const {
  const std::vector<LegendEntry> entries = legendEntries();
  const std::vector<QPoint> at = legendPositions(entries, nullptr);
  const int top = height() - legendHeight() + 2;
  for (size_t i = 0; i < entries.size(); ++i) {
    const QPoint pos = at[i] + QPoint(0, top);
    p.fillRect(QRect(pos.x(), pos.y() + 2, kSwatch, kSwatch), entries[i].swatch);
    p.setPen(palette().color(QPalette::Mid));
    p.drawRect(QRect(pos.x(), pos.y() + 2, kSwatch - 1, kSwatch - 1));
    p.setPen(palette().color(QPalette::WindowText));
    p.drawText(QPoint(pos.x() + kSwatch + 5, pos.y() + fontMetrics().ascent()), entries[i].name);
  }
}

void MemoryMapWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.setRenderHint(QPainter::Antialiasing, false);
  const QColor text = palette().color(QPalette::WindowText);
  p.setPen(text);
  if (bars_.empty()) {
    p.drawText(rect(), Qt::AlignCenter, tr("no memory figures yet"));
    return;
  }
  const int line = fontMetrics().height() + 2;
  if (!caption_.isEmpty())
    p.drawText(QRect(8, 0, width() - 16, line), Qt::AlignLeft | Qt::AlignVCenter, caption_);
  const QRect area = plotArea();
  const int group = area.width() / static_cast<int>(bars_.size());
  for (int i = 0; i < static_cast<int>(bars_.size()); ++i) {
    const MemoryBar& bar = bars_[static_cast<size_t>(i)];
    const Column c = columnAt(i);
    paintStack(p, c.measured, bar, bar.bytes, false);
    if (bar.has_plan) paintStack(p, c.planned, bar, bar.planned, true);
    p.setPen(text);
    const QRect slot(area.left() + i * group, 0, group, 0);
    // Measured: what this run holds (not other processes), so it compares with the plan.
    const QString ours = bar.measured ? tr("%1 ours").arg(bytesText(bar.processBytes()))
                                      : tr("%1 planned").arg(bytesText(bar.used()));
    const QString totals =
        bar.has_plan ? tr("%1 (plan %2)").arg(ours, bytesText(bar.plannedUsed())) : ours;
    p.drawText(QRect(slot.left(), area.top() - line, group, line), Qt::AlignCenter,
               fontMetrics().elidedText(totals, Qt::ElideRight, group));
    p.drawText(QRect(slot.left(), area.bottom() + 2, group, line), Qt::AlignCenter,
               fontMetrics().elidedText(bar.label, Qt::ElideRight, group));
    p.drawText(QRect(slot.left(), area.bottom() + 2 + line, group, line), Qt::AlignCenter,
               fontMetrics().elidedText(tr("of %1").arg(bytesText(bar.capacity_bytes)),
                                        Qt::ElideRight, group));
  }
  paintLegend(p);
}

QString MemoryMapWidget::sliceText(const MemoryBar& bar, int s, bool plan) const {
  const auto slice = static_cast<MemorySlice>(s);
  const uint64_t bytes = plan ? bar.planned[s] : bar.bytes[s];
  const double capacity = static_cast<double>(std::max<uint64_t>(1, bar.capacity_bytes));
  QStringList lines;
  lines << tr("%1 — %2%3: %4 (%5% of %6)")
               .arg(bar.label, plan ? tr("plan: ") : QString(), memorySliceName(slice, bar.gpu),
                    bytesText(bytes))
               .arg(100.0 * static_cast<double>(bytes) / capacity, 0, 'f', 1)
               .arg(bytesText(bar.capacity_bytes));
  if (!plan && bar.measured) {
    lines << tr("%1 bytes, from %2").arg(bytes).arg(memorySliceSource(slice, bar.gpu));
    if (bar.has_plan && s != static_cast<int>(MemorySlice::Free))
      lines << tr("planned: %1").arg(bytesText(bar.planned[s]));
  }
  if (!plan && !bar.parts[s].isEmpty()) lines << tr("of which (ledger):") << bar.parts[s];
  if (!bar.modules[s].isEmpty()) lines << tr("modules (plan):") << bar.modules[s];
  if (!bar.details.isEmpty()) lines << bar.details;
  return lines.join(QLatin1Char('\n'));
}

QString MemoryMapWidget::detailsAt(const QPoint& pos) const {
  for (int i = 0; i < static_cast<int>(bars_.size()); ++i) {
    const MemoryBar& bar = bars_[static_cast<size_t>(i)];
    const Column c = columnAt(i);
    for (const bool plan : {false, true}) {
      const QRect r = plan ? c.planned : c.measured;
      if (r.isEmpty() || !r.contains(pos)) continue;
      const auto rects = sliceRects(r, plan ? bar.planned : bar.bytes, bar.capacity_bytes);
      for (int s = 0; s < kMemorySliceCount; ++s) {
        if (rects[s].contains(QPointF(pos) + QPointF(0.5, 0.5))) return sliceText(bar, s, plan);
      }
      return (plan ? tr("%1 — plan: %2 of %3") : tr("%1: %2 used of %3"))
          .arg(bar.label, bytesText(plan ? bar.plannedUsed() : bar.used()),
               bytesText(bar.capacity_bytes));
    }
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
