#pragma once
// The memory map: one column per GPU and per host NUMA node, stacked by what holds the bytes
// (memory_bars.h: the engine's ledger categories, then what only the device knows, then free),
// and a narrower column beside it with the plan's figure for the same device. Hover names the
// slice, its bytes, where the number comes from and the modules behind it. The same widget shows
// a plan alone (the wizard's review page, the placement editor) and the live state (the
// dashboard: a MemorySnapshot while the model loads and after every step).

#include <QBrush>
#include <QColor>
#include <QString>
#include <QWidget>
#include <memory>
#include <vector>

#include "ui/memory_bars.h"

namespace tandem::ui {

class MemoryMapWidget : public QWidget {
  Q_OBJECT

 public:
  explicit MemoryMapWidget(QWidget* parent = nullptr);

  void setBars(std::vector<MemoryBar> bars);
  const std::vector<MemoryBar>& bars() const { return bars_; }
  // A line over the columns: what the figures are ("after step 3", "plan").
  void setCaption(const QString& caption);
  QString caption() const { return caption_; }
  // Live: the snapshot's columns (liveMemoryBars), with the plan beside them when one is set.
  void showSnapshot(const MemorySnapshot& snapshot);
  // The plan shown beside live columns from the next snapshot on (null: none).
  void setPlan(std::shared_ptr<const placement::MemoryPlan> plan);
  // Text for the slice under a point (empty when none); what the tooltip shows.
  QString detailsAt(const QPoint& pos) const;

  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* event) override;
  bool event(QEvent* event) override;

 private:
  struct Column {
    QRect measured;  // the bar's own figures
    QRect planned;   // the plan beside it (empty without one)
  };
  Column columnAt(int index) const;
  QRect plotArea() const;
  struct LegendEntry {
    QBrush swatch;
    QString name;
  };
  std::vector<LegendEntry> legendEntries() const;
  std::vector<QPoint> legendPositions(const std::vector<LegendEntry>& entries, int* rows) const;
  int legendHeight() const;
  void paintStack(QPainter& p, const QRect& r, const MemoryBar& bar,
                  const std::array<uint64_t, kMemorySliceCount>& bytes, bool plan) const;
  void paintLegend(QPainter& p) const;
  QString sliceText(const MemoryBar& bar, int slice, bool plan) const;

  std::vector<MemoryBar> bars_;
  QString caption_;
  std::shared_ptr<const placement::MemoryPlan> plan_;
};

// Free memory in a shade of the palette (light grey on light, dark grey on dark).
QColor memorySliceColor(MemorySlice slice, const QPalette& palette);

}  // namespace tandem::ui
