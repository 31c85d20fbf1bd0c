#pragma once
// A line per GPU (utilisation, memory, power, PCIe traffic, from NVML; none without NVIDIA's
// driver) and one for the CPU (busy share per NUMA node), refreshed every second while shown:
// on the training dashboard and the chat tab.

#include <QWidget>
#include <memory>

class QLabel;
class QTimer;

namespace tandem {
class CpuLoadMeter;
}

namespace tandem::ui {

class LiveUtilisation : public QWidget {
  Q_OBJECT

 public:
  explicit LiveUtilisation(QWidget* parent = nullptr);
  ~LiveUtilisation() override;

  QString text() const;  // what it shows now, as plain text (tests)
  int gpuLines() const { return gpu_lines_; }

 public slots:
  void refresh();

 protected:
  void showEvent(QShowEvent* event) override;
  void hideEvent(QHideEvent* event) override;

 private:
  QLabel* label_;
  QTimer* timer_;
  std::unique_ptr<CpuLoadMeter> cpu_;
  int gpu_lines_ = 0;
};

}  // namespace tandem::ui
