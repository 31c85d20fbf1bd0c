#include "ui/training_dashboard.h"

#include <QCheckBox>
#include <QDateTime>
#include <QGridLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QPlainTextEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QSplitter>
#include <QVBoxLayout>

#include "engine/core/units.h"
#include "engine/gpu/memory_sample.h"
#include "engine/train/loss_smoothing.h"
#include "ui/live_utilisation.h"
#include "ui/machine_info.h"
#include "ui/memory_map.h"
#include "ui/metric_chart.h"
#include "ui/sequence_fit_label.h"
#include "ui/training_controller.h"

namespace tandem::ui {

namespace {

QString duration(double seconds) { return QString::fromStdString(formatDuration(seconds)); }

}  // namespace

TrainingDashboard::TrainingDashboard(TrainingController& controller, const MachineInfo& machine,
                                     QWidget* parent)
    : QWidget(parent), controller_(controller), machine_(machine) {
  loss_chart_ = new MetricChart(tr("Training loss"), tr("loss"));
  raw_series_ = loss_chart_->addSeries(tr("raw"), QColor(0, 114, 178, 90), 1.5);
  smooth_series_ = loss_chart_->addSeries(tr("smoothed"), QColor(0, 114, 178), 2.5);
  lr_chart_ = new MetricChart(tr("Learning rate"), tr("lr"));
  lr_chart_->addSeries(tr("learning rate"), seriesColor(1));
  speed_chart_ = new MetricChart(tr("Throughput"), tr("tokens/s"));
  speed_chart_->addSeries(tr("tokens/s"), seriesColor(2));
  grad_chart_ = new MetricChart(tr("Gradient norm"), tr("‖g‖ before clipping"));
  grad_chart_->addSeries(tr("grad norm"), seriesColor(3));

  auto* charts = new QWidget;
  auto* grid = new QGridLayout(charts);
  grid->setContentsMargins(0, 0, 0, 0);
  grid->addWidget(loss_chart_, 0, 0);
  grid->addWidget(lr_chart_, 0, 1);
  grid->addWidget(speed_chart_, 1, 0);
  grid->addWidget(grad_chart_, 1, 1);

  log_scale_ = new QCheckBox(tr("&Log-scale loss"));
  log_scale_->setToolTip(
      tr("Show the loss on a logarithmic axis (useful once it has dropped by decades)"));
  connect(log_scale_, &QCheckBox::toggled, loss_chart_, &MetricChart::setLogScale);

  progress_ = new QProgressBar;
  progress_->setFormat(tr("step %v / %m"));
  progress_->setRange(0, 1);
  progress_->setValue(0);
  status_ = new QLabel(tr("No training run yet: start one from New fine-tune or Runs."));
  status_->setWordWrap(true);
  timing_ = new QLabel;
  pause_ = new QPushButton(QIcon(QStringLiteral(":/icons/pause.svg")), tr("&Pause"));
  pause_->setToolTip(tr("Hold the run at the end of this step; press again to continue"));
  stop_ = new QPushButton(QIcon(QStringLiteral(":/icons/stop.svg")), tr("&Stop with checkpoint"));
  stop_->setToolTip(
      tr("Finish this step, write a checkpoint and end; the run can be resumed later"));
  cancel_ = new QPushButton(tr("&Cancel"));
  cancel_->setToolTip(tr("End as soon as possible without a checkpoint"));
  resume_run_ = new QPushButton(QIcon(QStringLiteral(":/icons/play.svg")), tr("&Resume run"));
  resume_run_->setToolTip(tr("Continue the stopped run from its last checkpoint"));
  resume_run_->setVisible(false);
  connect(pause_, &QPushButton::clicked, this, [this] {
    if (controller_.isPaused())
      controller_.resume();
    else
      controller_.pause();
  });
  connect(stop_, &QPushButton::clicked, &controller_, &TrainingController::stop);
  connect(cancel_, &QPushButton::clicked, &controller_, &TrainingController::cancel);
  connect(resume_run_, &QPushButton::clicked, this, &TrainingDashboard::resumeRequested);

  auto* controls = new QHBoxLayout;
  controls->addWidget(progress_, 1);
  controls->addWidget(pause_);
  controls->addWidget(stop_);
  controls->addWidget(cancel_);
  controls->addWidget(resume_run_);

  auto* info = new QHBoxLayout;
  info->addWidget(status_, 1);
  info->addWidget(timing_);
  info->addWidget(log_scale_);

  log_ = new QPlainTextEdit;
  log_->setReadOnly(true);
  log_->setMaximumBlockCount(5000);
  log_->setAccessibleName(tr("Training log"));
  log_->setPlaceholderText(
      tr("Messages of the run (data summary, checkpoints, errors) appear here."));
  memory_map_ = new MemoryMapWidget;
  memory_map_->showSnapshot(gpu::sampleMemory("no run", 0));
  auto* memory_box = new QGroupBox(tr("Memory (live)"));
  auto* memory_layout = new QVBoxLayout(memory_box);
  memory_layout->addWidget(memory_map_);
  memory_layout->addWidget(new LiveUtilisation);
  sequence_fit_ = new SequenceFitLabel;
  memory_layout->addWidget(sequence_fit_);
  auto* log_box = new QGroupBox(tr("Log"));
  auto* log_layout = new QVBoxLayout(log_box);
  log_layout->addWidget(log_);
  auto* bottom = new QSplitter(Qt::Horizontal);
  bottom->addWidget(log_box);
  bottom->addWidget(memory_box);
  bottom->setStretchFactor(0, 1);
  bottom->setStretchFactor(1, 1);

  auto* splitter = new QSplitter(Qt::Vertical);
  splitter->addWidget(charts);
  splitter->addWidget(bottom);
  splitter->setStretchFactor(0, 3);
  splitter->setStretchFactor(1, 1);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(controls);
  layout->addLayout(info);
  layout->addWidget(splitter, 1);
  setRunningControls(false);

  connect(&controller_, &TrainingController::started, this, &TrainingDashboard::onStarted);
  connect(&controller_, &TrainingController::stepped, this, &TrainingDashboard::onStepped);
  connect(&controller_, &TrainingController::checkpointed, this,
          &TrainingDashboard::onCheckpointed);
  connect(&controller_, &TrainingController::messaged, this, &TrainingDashboard::appendLog);
  connect(&controller_, &TrainingController::finished, this, &TrainingDashboard::onFinished);
  connect(&controller_, &TrainingController::pausedChanged, this,
          &TrainingDashboard::onPausedChanged);
  connect(&controller_, &TrainingController::planned, memory_map_, &MemoryMapWidget::setPlan);
  connect(&controller_, &TrainingController::sequenceFitted, sequence_fit_,
          &SequenceFitLabel::setFit);
  connect(&controller_, &TrainingController::memorySampled, memory_map_,
          &MemoryMapWidget::showSnapshot);
}

QString TrainingDashboard::statusText() const { return status_->text(); }

void TrainingDashboard::setLogScale(bool log) { log_scale_->setChecked(log); }

void TrainingDashboard::showMachine() {
  if (!controller_.isRunning()) memory_map_->showSnapshot(gpu::sampleMemory("no run", 0));
}

QString TrainingDashboard::logText() const { return log_->toPlainText(); }

void TrainingDashboard::appendLog(const QString& line) {
  log_->appendPlainText(QStringLiteral("[%1] %2").arg(
      QTime::currentTime().toString(QStringLiteral("HH:mm:ss")), line));
}

void TrainingDashboard::setRunningControls(bool running) {
  pause_->setEnabled(running);
  stop_->setEnabled(running);
  cancel_->setEnabled(running);
  if (running) resume_run_->setVisible(false);
}

void TrainingDashboard::onStarted(const QString& output_dir) {
  steps_.clear();
  losses_.clear();
  for (MetricChart* c : {loss_chart_, lr_chart_, speed_chart_, grad_chart_}) {
    c->clear();
    c->setStepSpan(1);
  }
  progress_->setRange(0, 1);
  progress_->setValue(0);
  status_->setText(tr("Preparing: tokenizer, data and model → %1").arg(output_dir));
  timing_->clear();
  setRunningControls(true);
  memory_map_->setPlan(nullptr);  // the run's own arrives with its first figures
  pause_->setText(tr("&Pause"));
  appendLog(tr("training into %1").arg(output_dir));
}

void TrainingDashboard::onStepped(const StepEvent& p) {
  steps_.push_back(static_cast<double>(p.step));
  losses_.push_back(p.loss);
  loss_chart_->append(raw_series_, static_cast<double>(p.step), p.loss);
  // The smoothing weight depends on the run length, so the whole smoothed curve moves.
  const std::vector<double> smooth = train::smoothLoss(losses_);
  QList<QPointF> points;
  points.reserve(static_cast<qsizetype>(smooth.size()));
  for (size_t i = 0; i < smooth.size(); ++i) points.append(QPointF(steps_[i], smooth[i]));
  loss_chart_->replace(smooth_series_, points);
  for (MetricChart* c : {loss_chart_, lr_chart_, speed_chart_, grad_chart_})
    c->setStepSpan(static_cast<double>(p.total_steps));
  lr_chart_->append(0, static_cast<double>(p.step), p.learning_rate);
  speed_chart_->append(0, static_cast<double>(p.step), p.tokens_per_s);
  grad_chart_->append(0, static_cast<double>(p.step), p.grad_norm);
  progress_->setRange(0, static_cast<int>(std::max<int64_t>(1, p.total_steps)));
  progress_->setValue(static_cast<int>(p.step));
  status_->setText(tr("epoch %1   loss %2   lr %3   %4 tokens/s")
                       .arg(p.epoch, 0, 'f', 2)
                       .arg(p.loss, 0, 'f', 4)
                       .arg(p.learning_rate, 0, 'e', 2)
                       .arg(p.tokens_per_s, 0, 'f', 0) +
                   (p.world_size > 1
                        ? tr("   %1 ranks (rank 0's view; tokens/s of all ranks)").arg(p.world_size)
                        : QString()));
  timing_->setText(tr("elapsed %1   ETA %2").arg(duration(p.elapsed_s), duration(p.eta_s)));
}

void TrainingDashboard::onCheckpointed(qint64 step, const QString& dir) {
  appendLog(tr("checkpoint at step %1: %2").arg(step).arg(dir));
}

void TrainingDashboard::onPausedChanged(bool paused) {
  pause_->setText(paused ? tr("Con&tinue") : tr("&Pause"));
  pause_->setIcon(
      QIcon(paused ? QStringLiteral(":/icons/play.svg") : QStringLiteral(":/icons/pause.svg")));
  appendLog(paused ? tr("pausing at the end of this step") : tr("continuing"));
}

void TrainingDashboard::onFinished(const TrainFinish& f) {
  setRunningControls(false);
  pause_->setText(tr("&Pause"));
  switch (f.end) {
    case TrainEnd::Completed:
      status_->setText(tr("Completed: %1 steps, final loss %2. Adapter in %3")
                           .arg(f.steps)
                           .arg(f.final_loss, 0, 'f', 4)
                           .arg(f.output_dir));
      break;
    case TrainEnd::Stopped:
      status_->setText(
          tr("Stopped at step %1 with a checkpoint in %2").arg(f.steps).arg(f.output_dir));
      resume_run_->setVisible(true);
      break;
    case TrainEnd::Cancelled:
      status_->setText(tr("Cancelled at step %1 (no checkpoint written for it)").arg(f.steps));
      break;
    case TrainEnd::Failed:
      status_->setText(
          tr("<b>Failed:</b> %1<br>%2").arg(f.error.toHtmlEscaped(), f.what_to_do.toHtmlEscaped()));
      break;
  }
  appendLog(f.end == TrainEnd::Failed ? tr("failed: %1 — %2").arg(f.error, f.what_to_do)
                                      : tr("run %1").arg(trainEndName(f.end)));
}

}  // namespace tandem::ui
