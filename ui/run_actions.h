#pragma once
// The Run menu: pause/continue, stop with a checkpoint, cancel and resume the current training
// run from any page, with keyboard shortcuts (the dashboard's buttons do the same while it is
// shown). Enabled as the TrainingController's state allows.

#include <QObject>

#include "ui/train_finish.h"

class QAction;
class QMenu;

namespace tandem::ui {

class TrainingController;

class RunActions : public QObject {
  Q_OBJECT

 public:
  // Adds the actions to `menu`; `controller` must outlive this object.
  RunActions(TrainingController& controller, QMenu* menu);

  QAction* pauseAction() const { return pause_; }
  QAction* stopAction() const { return stop_; }
  QAction* cancelAction() const { return cancel_; }
  QAction* resumeAction() const { return resume_; }

 signals:
  // The stopped run should continue from its checkpoint (as the dashboard's Resume run).
  void resumeRequested();

 private:
  void update(bool running, bool paused);

  TrainingController& controller_;
  QAction* pause_;
  QAction* stop_;
  QAction* cancel_;
  QAction* resume_;
  bool resumable_ = false;  // the last run ended stopped, with a checkpoint
};

}  // namespace tandem::ui
