#include "ui/run_compare.h"

#include <yaml-cpp/yaml.h>

#include <QHeaderView>
#include <QLabel>
#include <QPixmap>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>
#include <set>

#include "engine/core/error.h"
#include "engine/store/run_store.h"
#include "engine/train/train_config.h"
#include "ui/error_text.h"
#include "ui/metric_chart.h"

namespace tandem::ui {

namespace {

void flatten(const YAML::Node& node, const QString& prefix, std::map<QString, QString>& out) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      for (const auto& entry : node) {
        const QString key = QString::fromStdString(entry.first.as<std::string>());
        flatten(entry.second, prefix.isEmpty() ? key : prefix + QLatin1Char('.') + key, out);
      }
      break;
    case YAML::NodeType::Sequence: {
      QStringList items;
      for (const auto& item : node) {
        items << (item.IsScalar() ? QString::fromStdString(item.Scalar())
                                  : QString::fromStdString(YAML::Dump(item)));
      }
      out[prefix] = items.join(QStringLiteral(", "));
      break;
    }
    case YAML::NodeType::Scalar: out[prefix] = QString::fromStdString(node.Scalar()); break;
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: out[prefix] = QString(); break;
  }
}

}  // namespace

std::map<QString, QString> flatConfig(const std::string& yaml_text) {
  std::string canonical = yaml_text;
  try {
    canonical = train::toYaml(train::parseTrainConfig(yaml_text, "run config"));
  } catch (const Error&) {
    // A config this version does not read (older keys): compare it as written.
  }
  std::map<QString, QString> out;
  try {
    const YAML::Node root = YAML::Load(canonical);
    if (root.IsMap()) flatten(root, QString(), out);
  } catch (const YAML::Exception&) {
    // Not YAML at all: nothing to compare, and the table says the runs differ in nothing known.
  }
  return out;
}

std::vector<ConfigDifference> configDifferences(const std::vector<std::string>& yaml_texts) {
  std::vector<std::map<QString, QString>> configs;
  std::set<QString> keys;
  for (const std::string& text : yaml_texts) {
    configs.push_back(flatConfig(text));
    for (const auto& [key, value] : configs.back()) keys.insert(key);
  }
  std::vector<ConfigDifference> out;
  for (const QString& key : keys) {
    ConfigDifference d{key, {}};
    for (const auto& config : configs) {
      const auto it = config.find(key);
      d.values.push_back(it == config.end() ? QString() : it->second);
    }
    bool all_equal = true;
    for (const QString& v : d.values) all_equal = all_equal && v == d.values.front();
    if (!all_equal) out.push_back(std::move(d));
  }
  return out;
}

RunCompare::RunCompare(store::RunStore* store, QWidget* parent) : QWidget(parent), store_(store) {
  chart_ = new MetricChart(tr("Loss of the selected runs"), tr("loss"));
  table_ = new QTableWidget(0, 1);
  table_->setObjectName(QStringLiteral("config_differences"));
  table_->setAccessibleName(tr("Settings that differ between the selected runs"));
  table_->verticalHeader()->setVisible(false);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setTextElideMode(Qt::ElideMiddle);
  table_->setMinimumWidth(420);  // a key and two values side by side at a glance
  note_ = new QLabel;
  note_->setWordWrap(true);
  auto* side = new QWidget;
  auto* side_layout = new QVBoxLayout(side);
  side_layout->setContentsMargins(0, 0, 0, 0);
  side_layout->addWidget(note_);
  side_layout->addWidget(table_, 1);
  auto* split = new QSplitter(Qt::Horizontal);
  split->addWidget(chart_);
  split->addWidget(side);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 2);
  split->setSizes({600, 400});
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(split);
  showRuns({});
}

void RunCompare::showRuns(const std::vector<const store::RunRecord*>& runs) {
  chart_->removeAllSeries();
  int n = 0;
  for (const store::RunRecord* r : runs) {
    const int series = chart_->addSeries(
        tr("#%1 %2").arg(r->id).arg(QString::fromStdString(r->name)), seriesColor(n++));
    if (!store_) continue;
    QList<QPointF> points;
    try {
      for (const store::StepMetrics& m : store_->metrics(r->id))
        points.append(QPointF(static_cast<double>(m.step), m.loss));
    } catch (const Error& e) {
      emit problem(errorText(e));
    }
    chart_->replace(series, points);
  }
  showDifferences(runs);
}

void RunCompare::showDifferences(const std::vector<const store::RunRecord*>& runs) {
  table_->clear();
  table_->setRowCount(0);
  table_->setColumnCount(1 + static_cast<int>(runs.size()));
  QStringList headers{tr("Setting")};
  std::vector<std::string> yamls;
  for (const store::RunRecord* r : runs) {
    headers << tr("#%1 %2").arg(r->id).arg(QString::fromStdString(r->name));
    yamls.push_back(r->config_yaml);
  }
  table_->setHorizontalHeaderLabels(headers);
  for (int column = 0; column < static_cast<int>(runs.size()); ++column) {
    // A swatch of the run's curve colour in its column header.
    QPixmap swatch(12, 12);  // one colour: scaling it for a 2x screen loses nothing
    swatch.fill(seriesColor(column));
    table_->horizontalHeaderItem(column + 1)->setIcon(QIcon(swatch));
  }
  if (runs.size() < 2) {
    note_->setText(tr("Select two or more runs (Ctrl-click) to see the settings they differ in."));
    table_->setVisible(false);
    return;
  }
  const std::vector<ConfigDifference> differences = configDifferences(yamls);
  if (differences.empty()) {
    note_->setText(tr("The selected runs have the same settings."));
  } else if (differences.size() == 1) {
    note_->setText(tr("1 setting differs; the rest are the same."));
  } else {
    note_->setText(tr("%1 settings differ; the rest are the same.").arg(differences.size()));
  }
  table_->setVisible(!differences.empty());
  table_->setRowCount(static_cast<int>(differences.size()));
  for (int row = 0; row < static_cast<int>(differences.size()); ++row) {
    const ConfigDifference& d = differences[row];
    table_->setItem(row, 0, new QTableWidgetItem(d.key));
    for (int column = 0; column < static_cast<int>(d.values.size()); ++column) {
      const QString text = d.values[column].isEmpty() ? tr("(not set)") : d.values[column];
      auto* item = new QTableWidgetItem(text);
      item->setToolTip(text);
      table_->setItem(row, column + 1, item);
    }
  }
  // The key column fits its names; the runs share the rest (long paths elide in the middle and
  // show whole in the tooltip).
  QHeaderView* header = table_->horizontalHeader();
  header->setSectionResizeMode(0, QHeaderView::ResizeToContents);
  for (int column = 1; column < table_->columnCount(); ++column)
    header->setSectionResizeMode(column, QHeaderView::Stretch);
}

QStringList RunCompare::differingKeys() const {
  QStringList keys;
  for (int row = 0; row < table_->rowCount(); ++row) keys << table_->item(row, 0)->text();
  return keys;
}

}  // namespace tandem::ui
