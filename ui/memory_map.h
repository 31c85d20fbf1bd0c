#pragma once
// The memory map: one horizontal bar per GPU and per NUMA node, split by what holds the bytes
// (weights, LoRA, optimizer, activations, KV/cache, scratch, other processes, free), with the
// numbers on hover. The same widget shows a plan (before a run) and the live state (during one:
// the engine's MemoryLedger figures from each StepEvent plus the system's free RAM).

#include <QString>
#include <QWidget>
#include <array>
#include <cstdint>
#include <vector>

#include "engine/core/memory_ledger.h"

namespace tandem::ui {

struct MachineInfo;
}  // namespace tandem::ui

namespace tandem::placement {
struct MemoryPlan;
}

namespace tandem::ui {

// The ledger's categories, then what the engine does not account for.
enum class MemorySlice { Weights = 0, Lora, Optimizer, Activations, Cache, Scratch, Other, Free };
inline constexpr int kMemorySliceCount = 8;
QString memorySliceName(MemorySlice slice);

struct MemoryBar {
  QString device;  // "cuda:0", "cpu:numa0"
  QString label;   // shown left of the bar
  uint64_t capacity_bytes = 0;
  std::array<uint64_t, kMemorySliceCount> bytes{};
  QString details;  // extra hover lines (a plan's items)

  uint64_t used() const;  // everything but Free
};

// Live bars: GPUs from the probe (capacity) and the ledger, NUMA nodes from a fresh topology
// read (capacity and free) and the ledger. Ledger devices "cpu" and "cpu:numaN" map to nodes;
// "cpu" goes to node 0 on a one-node machine and to its own bar otherwise.
std::vector<MemoryBar> liveMemoryBars(const MachineInfo& machine,
                                      const std::vector<DeviceMemoryUsage>& ledger);

// Planned bars: the memory planner's bytes per device. Its categories map onto the slices:
// lora_optimizer -> LoRA, expert_cache -> activations, packed_transposed -> weights,
// kv_cache -> KV/cache, pinned_staging and overhead -> scratch; each bar lists the plan's items
// on hover. Capacity is what the plan may use; the rest is free.
std::vector<MemoryBar> plannedMemoryBars(const placement::MemoryPlan& plan);

class MemoryMapWidget : public QWidget {
  Q_OBJECT

 public:
  explicit MemoryMapWidget(QWidget* parent = nullptr);

  void setBars(std::vector<MemoryBar> bars);
  const std::vector<MemoryBar>& bars() const { return bars_; }
  // Text for the slice under a point (empty when none); what the tooltip shows.
  QString detailsAt(const QPoint& pos) const;

  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* event) override;
  bool event(QEvent* event) override;

 private:
  QRect barRect(int index) const;
  int labelWidth() const;

  std::vector<MemoryBar> bars_;
};

QColor memorySliceColor(MemorySlice slice);

}  // namespace tandem::ui
