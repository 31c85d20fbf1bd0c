#include "ui/training_controller.h"

#include <QMetaObject>

#include "engine/core/error.h"
#include "engine/store/run_store.h"
#include "engine/train/trainer.h"
#include "engine/train/training_run.h"
#include "ui/engine_thread.h"

namespace tandem::ui {

QString trainEndName(TrainEnd end) {
  switch (end) {
    case TrainEnd::Completed: return QStringLiteral("completed");
    case TrainEnd::Stopped: return QStringLiteral("stopped");
    case TrainEnd::Cancelled: return QStringLiteral("cancelled");
    case TrainEnd::Failed: return QStringLiteral("failed");
  }
  return {};
}

// Lives on the training thread; every call hops to the GUI thread through a queued emit.
class TrainingController::Listener : public TrainListener {
 public:
  explicit Listener(TrainingController& owner) : owner_(owner) {}

  void onStep(const StepEvent& e) override {
    QMetaObject::invokeMethod(&owner_, [o = &owner_, e] { emit o->stepped(e); }, Qt::QueuedConnection);
    // The trainer calls us between optimizer steps: the one place a pause is safe.
    owner_.waitWhilePaused();
  }
  void onCheckpoint(int64_t step, const std::filesystem::path& dir) override {
    const QString path = QString::fromStdString(dir.string());
    QMetaObject::invokeMethod(&owner_, [o = &owner_, step, path] { emit o->checkpointed(step, path); },
                              Qt::QueuedConnection);
  }
  void onMessage(const std::string& message) override {
    const QString text = QString::fromStdString(message);
    QMetaObject::invokeMethod(&owner_, [o = &owner_, text] { emit o->messaged(text); }, Qt::QueuedConnection);
  }

 private:
  TrainingController& owner_;
};

TrainingController::TrainingController(store::RunStore* store, QObject* parent) : QObject(parent), store_(store) {
  qRegisterMetaType<StepEvent>();
  qRegisterMetaType<TrainFinish>();
}

TrainingController::~TrainingController() {
  cancel();
  if (thread_.joinable()) thread_.join();
}

bool TrainingController::isPaused() const {
  std::lock_guard lock(pause_mutex_);
  return paused_;
}

void TrainingController::start(const train::TrainConfig& config) {
  if (running_) {
    TrainFinish refused;
    refused.end = TrainEnd::Failed;
    refused.error = tr("a training run is already going");
    refused.what_to_do = tr("stop it first, or wait until it ends");
    emit finished(refused);
    return;
  }
  if (thread_.joinable()) thread_.join();  // the previous job has already ended
  config_ = config;
  running_ = true;
  stop_ = {};
  cancel_ = {};
  {
    std::lock_guard lock(pause_mutex_);
    paused_ = false;
  }
  emit started(QString::fromStdString(config.output_dir.string()));
  thread_ = std::jthread([this, config, stop = stop_.get_token(), cancel = cancel_.get_token()] {
    run(config, stop, cancel);
  });
}

void TrainingController::run(train::TrainConfig config, std::stop_token stop, std::stop_token cancel) {
  lowerCurrentThreadPriority();
  Listener listener(*this);
  TrainFinish finish;
  finish.output_dir = QString::fromStdString(config.output_dir.string());
  try {
    const train::TrainingRunOutcome outcome = train::runTraining(config, listener, stop, cancel, store_);
    finish.steps = outcome.result.steps;
    finish.final_loss = outcome.result.final_loss;
    finish.run_id = outcome.run_id;
    finish.end = outcome.result.outcome == TrainOutcome::Completed ? TrainEnd::Completed
                 : outcome.result.outcome == TrainOutcome::Stopped ? TrainEnd::Stopped
                                                                          : TrainEnd::Cancelled;
  } catch (const Error& e) {
    finish.end = TrainEnd::Failed;
    finish.error = QString::fromStdString(e.message());
    finish.what_to_do = QString::fromStdString(e.whatToDo());
  } catch (const std::exception& e) {
    finish.end = TrainEnd::Failed;
    finish.error = QString::fromStdString(e.what());
  }
  QMetaObject::invokeMethod(
      this,
      [this, finish] {
        running_ = false;
        emit finished(finish);
      },
      Qt::QueuedConnection);
}

void TrainingController::waitWhilePaused() {
  std::unique_lock lock(pause_mutex_);
  const std::stop_token stop = stop_.get_token();
  const std::stop_token cancel = cancel_.get_token();
  if (!paused_ || stop.stop_requested() || cancel.stop_requested()) return;
  int64_t run_id = 0;
  if (store_) {
    if (const auto run = store_->findByOutputDir(config_.output_dir)) run_id = run->id;
  }
  if (run_id) {
    store_->setStatus(run_id, store::RunStatus::Paused);
    store_->recordEvent(run_id, "paused", "paused from the studio");
  }
  // Either token ends the wait: stop still writes its checkpoint once the trainer goes on.
  std::stop_callback on_stop(stop, [this] { pause_cv_.notify_all(); });
  std::stop_callback on_cancel(cancel, [this] { pause_cv_.notify_all(); });
  pause_cv_.wait(lock, [&] { return !paused_ || stop.stop_requested() || cancel.stop_requested(); });
  if (run_id) {
    store_->setStatus(run_id, store::RunStatus::Running);
    store_->recordEvent(run_id, "resumed", "resumed from the studio");
  }
}

void TrainingController::pause() {
  if (!running_) return;
  {
    std::lock_guard lock(pause_mutex_);
    if (paused_) return;
    paused_ = true;
  }
  emit pausedChanged(true);
}

void TrainingController::resume() {
  {
    std::lock_guard lock(pause_mutex_);
    if (!paused_) return;
    paused_ = false;
  }
  pause_cv_.notify_all();
  emit pausedChanged(false);
}

void TrainingController::stop() {
  stop_.request_stop();
  resume();
}

void TrainingController::cancel() {
  cancel_.request_stop();
  resume();
}

}  // namespace tandem::ui
