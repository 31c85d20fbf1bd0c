#pragma once
// Run comparison (the Runs page): the loss curves of the selected runs on one chart, and next to
// it the settings in which they differ, one row per key, one column per run. Settings are each
// run's recorded YAML, read back through parseTrainConfig and written out canonically (toYaml),
// so a key one run spelled and the other left at its default still counts as the same value.

#include <QString>
#include <QWidget>
#include <map>
#include <string>
#include <vector>

class QLabel;
class QTableWidget;

namespace tandem::store {
class RunStore;
struct RunRecord;
}  // namespace tandem::store

namespace tandem::ui {

class MetricChart;

// key -> value text of a training YAML, canonical when it parses as a TrainConfig, else as
// written (nested maps as "a.b", lists joined by ", ").
std::map<QString, QString> flatConfig(const std::string& yaml_text);

struct ConfigDifference {
  QString key;
  std::vector<QString> values;  // one per config; empty text where a config lacks the key
};
// The keys whose values are not all equal, in key order.
std::vector<ConfigDifference> configDifferences(const std::vector<std::string>& yaml_texts);

class RunCompare : public QWidget {
  Q_OBJECT

 public:
  // `store` may be null (no history open); it must outlive the widget.
  explicit RunCompare(store::RunStore* store, QWidget* parent = nullptr);

  void showRuns(const std::vector<const store::RunRecord*>& runs);
  MetricChart* chart() const { return chart_; }
  QTableWidget* differencesTable() const { return table_; }
  QStringList differingKeys() const;  // the table's rows, top to bottom

 signals:
  void problem(const QString& text);  // a run's metrics could not be read

 private:
  void showDifferences(const std::vector<const store::RunRecord*>& runs);

  store::RunStore* store_;
  MetricChart* chart_;
  QTableWidget* table_;
  QLabel* note_;
};

}  // namespace tandem::ui
