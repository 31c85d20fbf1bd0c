#pragma once
// TrainingController: the studio's adapter for one training job. runTraining runs on its own
// std::jthread; a TrainListener on that thread re-emits each event as a queued signal, so widgets
// only ever run on the GUI thread and the GUI never waits on the engine (DESIGN.md).
//
// Pause holds the training thread at the next step boundary (the trainer's PauseGate, which
// resume, stop and cancel all open). Stop ends the run at a step boundary with a checkpoint
// (resumable); cancel ends it at the next micro-batch without one. The run store records
// paused/resumed as status changes and events (runTraining does).

#include <QObject>
#include <QString>
#include <memory>
#include <stop_token>
#include <thread>

#include "engine/core/pause_gate.h"
#include "engine/train/train_config.h"
#include "ui/train_finish.h"

namespace tandem::store {
class RunStore;
}
namespace tandem::placement {
struct MemoryPlan;
struct SequenceFit;
}  // namespace tandem::placement

namespace tandem::ui {

class TrainingController : public QObject {
  Q_OBJECT

 public:
  // `store` (may be null) must outlive the controller; the run is recorded there.
  explicit TrainingController(store::RunStore* store, QObject* parent = nullptr);
  ~TrainingController() override;  // cancels a running job and joins its thread

  bool isRunning() const { return running_; }
  bool isPaused() const;
  const train::TrainConfig& config() const { return config_; }

 public slots:
  // Refused (failed signal) while a job runs.
  void start(const tandem::train::TrainConfig& config);
  void pause();
  void resume();
  void stop();    // at the end of this step, with a checkpoint
  void cancel();  // as soon as possible, without a checkpoint

 signals:
  void started(const QString& output_dir);
  void stepped(const tandem::StepEvent& point);
  void checkpointed(qint64 step, const QString& dir);
  void messaged(const QString& message);
  void pausedChanged(bool paused);
  void finished(const tandem::ui::TrainFinish& finish);
  // Where the memory is (while the model loads, after every step), and the plan it was judged by.
  void memorySampled(const tandem::MemorySnapshot& snapshot);
  void planned(std::shared_ptr<const tandem::placement::MemoryPlan> plan);
  // The longest cutoff_len that fits, with the plan (sequence_fit_label.h).
  void sequenceFitted(std::shared_ptr<const tandem::placement::SequenceFit> fit);

 private:
  class Listener;
  friend class Listener;
  void run(train::TrainConfig config, std::stop_token stop, std::stop_token cancel);
  void sendPlan(const train::TrainConfig& config);  // on the training thread

  store::RunStore* store_;
  train::TrainConfig config_;
  bool running_ = false;  // GUI thread only
  std::stop_source stop_;
  std::stop_source cancel_;
  PauseGate pause_;
  std::jthread thread_;
};

}  // namespace tandem::ui
