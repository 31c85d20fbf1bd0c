#include "ui/training_controller.h"

#include <QMetaObject>

#include "engine/core/error.h"
#include "engine/io/model_config.h"
#include "engine/model/machine_probe.h"
#include "engine/placement/memory_planner.h"
#include "engine/placement/sequence_fit.h"
#include "engine/store/run_store.h"
#include "engine/train/trainer.h"
#include "engine/train/training_plan.h"
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
    QMetaObject::invokeMethod(
        &owner_, [o = &owner_, e] { emit o->stepped(e); }, Qt::QueuedConnection);
  }
  void onCheckpoint(int64_t step, const std::filesystem::path& dir) override {
    const QString path = QString::fromStdString(dir.string());
    QMetaObject::invokeMethod(
        &owner_, [o = &owner_, step, path] { emit o->checkpointed(step, path); },
        Qt::QueuedConnection);
  }
  // Also called from the load's sampling thread: invokeMethod only queues.
  void onMemory(const MemorySnapshot& s) override {
    QMetaObject::invokeMethod(
        &owner_, [o = &owner_, s] { emit o->memorySampled(s); }, Qt::QueuedConnection);
  }
  void onMessage(const std::string& message) override {
    const QString text = QString::fromStdString(message);
    QMetaObject::invokeMethod(
        &owner_, [o = &owner_, text] { emit o->messaged(text); }, Qt::QueuedConnection);
  }

 private:
  TrainingController& owner_;
};

TrainingController::TrainingController(store::RunStore* store, QObject* parent)
    : QObject(parent), store_(store) {
  qRegisterMetaType<StepEvent>();
  qRegisterMetaType<TrainFinish>();
  qRegisterMetaType<MemorySnapshot>();
  qRegisterMetaType<std::shared_ptr<const placement::MemoryPlan>>();
  qRegisterMetaType<std::shared_ptr<const placement::SequenceFit>>();
}

// The memory planner's verdict for the run, as runTraining judges it (same config, this machine),
// for the memory map's plan column. A run the planner cannot judge still runs: no plan column.
void TrainingController::sendPlan(const train::TrainConfig& config) {
  try {
    const io::ModelConfig model = io::readModelConfig(config.model_name_or_path);
    const placement::Hardware hardware = model::probeMachine();
    auto plan =
        std::make_shared<const placement::MemoryPlan>(train::planTraining(config, model, hardware));
    QMetaObject::invokeMethod(
        this, [this, plan] { emit planned(plan); }, Qt::QueuedConnection);
    // The training page's line: the longest cutoff_len this plan's placement fits.
    auto fit = std::make_shared<const placement::SequenceFit>(
        train::sequenceFitFor(config, model, *plan, hardware));
    QMetaObject::invokeMethod(
        this, [this, fit] { emit sequenceFitted(fit); }, Qt::QueuedConnection);
  } catch (const std::exception&) {
    // runTraining reports what is wrong with the config; the map just has no plan.
  }
}

TrainingController::~TrainingController() {
  cancel();
  if (thread_.joinable()) thread_.join();
}

bool TrainingController::isPaused() const { return pause_.paused(); }

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
  pause_.resume();
  emit started(QString::fromStdString(config.output_dir.string()));
  thread_ = std::jthread([this, config, stop = stop_.get_token(), cancel = cancel_.get_token()] {
    run(config, stop, cancel);
  });
}

void TrainingController::run(train::TrainConfig config, std::stop_token stop,
                             std::stop_token cancel) {
  lowerCurrentThreadPriority();
  sendPlan(config);
  Listener listener(*this);
  TrainFinish finish;
  finish.output_dir = QString::fromStdString(config.output_dir.string());
  try {
    const train::TrainingRunOutcome outcome =
        train::runTraining(config, listener, {stop, cancel, &pause_}, store_);
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

void TrainingController::pause() {
  if (!running_ || pause_.paused()) return;
  pause_.pause();
  emit pausedChanged(true);
}

void TrainingController::resume() {
  if (!pause_.paused()) return;
  pause_.resume();
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
