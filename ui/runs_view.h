#pragma once
// Runs: the training history from the SQLite run store (the same one `tandem runs` reads):
// status, model, dataset, steps, final loss, duration. Select several runs to compare their loss
// curves; open a run's output folder; resume a run that was stopped, failed or interrupted (a
// crashed process shows as interrupted: refresh() asks the store to mark runs whose owner is gone).

#include <QWidget>
#include <cstdint>
#include <vector>

#include "engine/store/run_store.h"
#include "engine/train/train_config.h"

class QLabel;
class QPushButton;
class QTableWidget;

namespace tandem::ui {

class MetricChart;
class RunCompare;

class RunsView : public QWidget {
  Q_OBJECT

 public:
  explicit RunsView(store::RunStore* store, QWidget* parent = nullptr);

  int runCount() const { return static_cast<int>(runs_.size()); }
  const std::vector<store::RunRecord>& runs() const { return runs_; }
  void selectRuns(const std::vector<int64_t>& ids);
  MetricChart* compareChart() const;
  RunCompare* runCompare() const { return compare_; }
  // The config that resumes a run: its recorded YAML, resuming from the newest checkpoint.
  // Throws tandem::Error when the YAML no longer parses.
  static train::TrainConfig resumeConfig(const store::RunRecord& run);

 public slots:
  void refresh();
  void compareSelected();

 signals:
  void resumeRequested(const tandem::train::TrainConfig& config);
  void chatRequested(const QString& base_model, const QString& adapter_dir,
                     const QString& template_name);

 private:
  std::vector<const store::RunRecord*> selected() const;
  void updateButtons();

  store::RunStore* store_;
  std::vector<store::RunRecord> runs_;
  QTableWidget* table_;
  RunCompare* compare_;  // the curves and the settings that differ
  QLabel* problem_;
  QPushButton* open_;
  QPushButton* resume_;
  QPushButton* chat_;
};

}  // namespace tandem::ui
