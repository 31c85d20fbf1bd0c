#include "ui/runs_view.h"

#include <QDateTime>
#include <QDesktopServices>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QShortcut>
#include <QSplitter>
#include <QTableWidget>
#include <QUrl>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/model/checkpoint_dir.h"
#include "ui/error_text.h"
#include "ui/metric_chart.h"
#include "ui/run_compare.h"
#include "ui/wizard_pages.h"

namespace tandem::ui {

namespace {

enum Column { kId, kName, kStatus, kModel, kDataset, kSteps, kLoss, kDuration, kStarted, kColumns };

QColor statusColor(store::RunStatus s) {
  switch (s) {
    case store::RunStatus::Running: return QColor(0, 114, 178);
    case store::RunStatus::Paused: return QColor(86, 180, 233);
    case store::RunStatus::Completed: return QColor(27, 127, 59);
    case store::RunStatus::Stopped: return QColor(110, 110, 110);
    case store::RunStatus::Failed: return QColor(176, 0, 32);
    case store::RunStatus::Interrupted: return QColor(213, 94, 0);
  }
  return {};
}

bool resumable(const store::RunRecord& r) {
  if (r.status != store::RunStatus::Stopped && r.status != store::RunStatus::Failed &&
      r.status != store::RunStatus::Interrupted) {
    return false;
  }
  return !model::lastCheckpoint(r.output_dir).empty();
}

}  // namespace

RunsView::RunsView(store::RunStore* store, QWidget* parent) : QWidget(parent), store_(store) {
  table_ = new QTableWidget(0, kColumns);
  table_->setHorizontalHeaderLabels({tr("ID"), tr("Name"), tr("Status"), tr("Model"), tr("Dataset"),
                                     tr("Steps"), tr("Final loss"), tr("Duration"), tr("Started")});
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setSectionResizeMode(kModel, QHeaderView::Stretch);
  table_->verticalHeader()->setVisible(false);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::ExtendedSelection);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setAccessibleName(tr("Run history"));
  table_->setTextElideMode(Qt::ElideMiddle);  // long paths keep their start and their name
  compare_ = new RunCompare(store_);
  problem_ = makeProblemLabel();

  auto* refresh = new QPushButton(tr("&Refresh"));
  refresh->setShortcut(QKeySequence::Refresh);
  refresh->setToolTip(
      tr("Reload the history (F5); runs whose process is gone become 'interrupted'"));
  auto* compare = new QPushButton(tr("Co&mpare curves"));
  compare->setToolTip(
      tr("Plot the loss of every selected run and list the settings they differ in (Ctrl-click "
         "or Shift-click to select several)"));
  open_ = new QPushButton(QIcon(QStringLiteral(":/icons/folder.svg")), tr("&Open output folder"));
  resume_ = new QPushButton(QIcon(QStringLiteral(":/icons/play.svg")), tr("Res&ume"));
  resume_->setToolTip(
      tr("Continue a stopped, failed or interrupted run from its newest checkpoint"));
  chat_ = new QPushButton(QIcon(QStringLiteral(":/icons/chat.svg")), tr("C&hat with adapter"));
  auto* buttons = new QHBoxLayout;
  for (QPushButton* b : {refresh, compare, open_, resume_, chat_}) buttons->addWidget(b);
  buttons->addStretch(1);

  auto* split = new QSplitter(Qt::Vertical);
  split->addWidget(table_);
  split->addWidget(compare_);
  split->setStretchFactor(0, 1);
  split->setStretchFactor(1, 1);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(buttons);
  layout->addWidget(problem_);
  layout->addWidget(split, 1);

  connect(compare_, &RunCompare::problem, this,
          [this](const QString& p) { showProblem(problem_, p); });
  connect(refresh, &QPushButton::clicked, this, &RunsView::refresh);
  connect(compare, &QPushButton::clicked, this, &RunsView::compareSelected);
  connect(table_, &QTableWidget::itemSelectionChanged, this, &RunsView::updateButtons);
  connect(table_, &QTableWidget::itemSelectionChanged, this, &RunsView::compareSelected);
  connect(open_, &QPushButton::clicked, this, [this] {
    for (const store::RunRecord* r : selected()) {
      QDesktopServices::openUrl(
          QUrl::fromLocalFile(QString::fromStdString(r->output_dir.string())));
    }
  });
  connect(resume_, &QPushButton::clicked, this, [this] {
    const auto runs = selected();
    if (runs.size() != 1) return;
    try {
      emit resumeRequested(resumeConfig(*runs.front()));
    } catch (const Error& e) {
      showProblem(problem_, errorText(e));
    }
  });
  connect(chat_, &QPushButton::clicked, this, [this] {
    const auto runs = selected();
    if (runs.size() != 1) return;
    try {
      const train::TrainConfig config = resumeConfig(*runs.front());
      emit chatRequested(QString::fromStdString(config.model_name_or_path),
                         QString::fromStdString(config.output_dir.string()),
                         QString::fromStdString(config.template_name));
    } catch (const Error& e) {
      showProblem(problem_, errorText(e));
    }
  });
  updateButtons();
}

train::TrainConfig RunsView::resumeConfig(const store::RunRecord& run) {
  train::TrainConfig config =
      train::parseTrainConfig(run.config_yaml, "run " + std::to_string(run.id) + "'s config");
  config.overwrite_output_dir =
      false;  // overwriting would throw away the checkpoints we resume from
  config.resume = train::ResumeFrom::Latest;
  return config;
}

void RunsView::refresh() {
  if (!store_) {
    showProblem(problem_, tr("No run store is open."));
    return;
  }
  std::vector<int64_t> keep;
  for (const store::RunRecord* r : selected()) keep.push_back(r->id);
  try {
    store_->markInterrupted();
    runs_ = store_->listRuns();
    showProblem(problem_, {});
  } catch (const Error& e) {
    showProblem(problem_, errorText(e));
    return;
  }
  const QSignalBlocker block(table_);
  table_->setRowCount(static_cast<int>(runs_.size()));
  const double now = static_cast<double>(QDateTime::currentSecsSinceEpoch());
  for (int i = 0; i < static_cast<int>(runs_.size()); ++i) {
    const store::RunRecord& r = runs_[i];
    auto set = [&](int column, const QString& text) {
      auto* item = new QTableWidgetItem(text);
      item->setToolTip(text);
      table_->setItem(i, column, item);
      return item;
    };
    set(kId, QString::number(r.id));
    set(kName, QString::fromStdString(r.name));
    QTableWidgetItem* status =
        set(kStatus, QString::fromStdString(std::string(store::runStatusName(r.status))));
    status->setForeground(statusColor(r.status));
    if (!r.error.empty()) status->setToolTip(QString::fromStdString(r.error));
    set(kModel, QString::fromStdString(r.model));
    set(kDataset, QString::fromStdString(r.dataset));
    set(kSteps, tr("%1 / %2").arg(r.last_step.value_or(0)).arg(r.total_steps));
    set(kLoss, r.final_loss ? (std::isnan(*r.final_loss) ? tr("NaN")
                                                         : QString::number(*r.final_loss, 'f', 4))
                            : QString());
    set(kDuration, QString::fromStdString(formatDuration(r.durationS(now))));
    set(kStarted, r.started_at ? QDateTime::fromSecsSinceEpoch(static_cast<qint64>(*r.started_at))
                                     .toString(QStringLiteral("yyyy-MM-dd HH:mm"))
                               : QString());
  }
  selectRuns(keep);
  updateButtons();
}

void RunsView::selectRuns(const std::vector<int64_t>& ids) {
  table_->clearSelection();
  for (int i = 0; i < static_cast<int>(runs_.size()); ++i) {
    if (std::find(ids.begin(), ids.end(), runs_[i].id) == ids.end()) continue;
    table_->selectionModel()->select(table_->model()->index(i, 0),
                                     QItemSelectionModel::Select | QItemSelectionModel::Rows);
  }
}

std::vector<const store::RunRecord*> RunsView::selected() const {
  std::vector<const store::RunRecord*> out;
  for (const QModelIndex& index : table_->selectionModel()->selectedRows()) {
    if (index.row() < static_cast<int>(runs_.size())) out.push_back(&runs_[index.row()]);
  }
  return out;
}

void RunsView::updateButtons() {
  const auto runs = selected();
  open_->setEnabled(!runs.empty());
  resume_->setEnabled(runs.size() == 1 && resumable(*runs.front()));
  chat_->setEnabled(runs.size() == 1 && runs.front()->status == store::RunStatus::Completed);
}

MetricChart* RunsView::compareChart() const { return compare_->chart(); }

void RunsView::compareSelected() { compare_->showRuns(selected()); }

}  // namespace tandem::ui
