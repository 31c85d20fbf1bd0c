#pragma once
// The training dashboard: loss (raw and LLaMA-Factory-smoothed, log-scale toggle), learning
// rate, tokens/s and grad norm charts; progress with step/total, elapsed and ETA; pause, stop
// with checkpoint, resume and cancel; the log; the live memory map. It only reacts to the
// TrainingController's signals and calls its slots, so it never blocks on the engine.

#include <QWidget>
#include <vector>

#include "ui/train_finish.h"

class QCheckBox;
class QLabel;
class QPlainTextEdit;
class QProgressBar;
class QPushButton;

namespace tandem::ui {

class MemoryMapWidget;
class SequenceFitLabel;
class MetricChart;
class TrainingController;
struct MachineInfo;

class TrainingDashboard : public QWidget {
  Q_OBJECT

 public:
  TrainingDashboard(TrainingController& controller, const MachineInfo& machine,
                    QWidget* parent = nullptr);

  int pointsReceived() const { return static_cast<int>(losses_.size()); }
  MetricChart* lossChart() const { return loss_chart_; }
  MemoryMapWidget* memoryMap() const { return memory_map_; }
  SequenceFitLabel* sequenceFit() const { return sequence_fit_; }
  QString logText() const;
  QString statusText() const;  // the line over the charts: loss, lr, tokens/s, ranks
  void setLogScale(bool log);
  // The machine's probe arrived: the idle memory map shows its GPUs too.
  void showMachine();

 signals:
  // The user asked to resume a run that was stopped here: the same config again.
  void resumeRequested();

 private slots:
  void onStarted(const QString& output_dir);
  void onStepped(const tandem::StepEvent& point);
  void onCheckpointed(qint64 step, const QString& dir);
  void onFinished(const tandem::ui::TrainFinish& finish);
  void onPausedChanged(bool paused);

 private:
  void appendLog(const QString& line);
  void setRunningControls(bool running);

  TrainingController& controller_;
  const MachineInfo& machine_;
  MetricChart* loss_chart_;
  MetricChart* lr_chart_;
  MetricChart* speed_chart_;
  MetricChart* grad_chart_;
  int raw_series_ = 0, smooth_series_ = 0;
  QCheckBox* log_scale_;
  QProgressBar* progress_;
  QLabel* status_;
  QLabel* timing_;
  QPushButton* pause_;
  QPushButton* stop_;
  QPushButton* cancel_;
  QPushButton* resume_run_;
  QPlainTextEdit* log_;
  MemoryMapWidget* memory_map_;
  SequenceFitLabel* sequence_fit_;
  std::vector<double> steps_, losses_;
};

}  // namespace tandem::ui
