#include "ui/run_actions.h"

#include <QAction>
#include <QMenu>

#include "ui/training_controller.h"

namespace tandem::ui {

RunActions::RunActions(TrainingController& controller, QMenu* menu)
    : QObject(menu), controller_(controller) {
  pause_ = menu->addAction(QIcon(QStringLiteral(":/icons/pause.svg")), tr("&Pause"));
  pause_->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_P));
  stop_ = menu->addAction(QIcon(QStringLiteral(":/icons/stop.svg")), tr("&Stop with checkpoint"));
  stop_->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_S));
  cancel_ = menu->addAction(tr("&Cancel without checkpoint"));
  cancel_->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_K));
  menu->addSeparator();
  resume_ = menu->addAction(QIcon(QStringLiteral(":/icons/play.svg")), tr("&Resume stopped run"));
  resume_->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_R));

  connect(pause_, &QAction::triggered, this, [this] {
    if (controller_.isPaused())
      controller_.resume();
    else
      controller_.pause();
  });
  connect(stop_, &QAction::triggered, &controller_, &TrainingController::stop);
  connect(cancel_, &QAction::triggered, &controller_, &TrainingController::cancel);
  connect(resume_, &QAction::triggered, this, &RunActions::resumeRequested);
  connect(&controller_, &TrainingController::started, this, [this] {
    resumable_ = false;
    update(true, false);
  });
  connect(&controller_, &TrainingController::pausedChanged, this,
          [this](bool paused) { update(controller_.isRunning(), paused); });
  connect(&controller_, &TrainingController::finished, this, [this](const TrainFinish& f) {
    resumable_ = f.end == TrainEnd::Stopped;
    update(false, false);
  });
  update(controller_.isRunning(), controller_.isPaused());
}

void RunActions::update(bool running, bool paused) {
  pause_->setEnabled(running);
  pause_->setText(paused ? tr("Con&tinue") : tr("&Pause"));
  stop_->setEnabled(running);
  cancel_->setEnabled(running);
  resume_->setEnabled(!running && resumable_);
}

}  // namespace tandem::ui
