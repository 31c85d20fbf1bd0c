#pragma once
// Prints a training run's progress in the terminal: one line per step (refreshed in place on a
// terminal, a line per logged step otherwise) with step/total, loss, lr, grad norm, tokens/s,
// elapsed and ETA, plus the trainer's messages.

#include <mutex>
#include <string>

#include "engine/store/run_store.h"
#include "engine/train/trainer.h"
#include "engine/train/training_run.h"

namespace tandem::cli {

class ProgressPrinter : public TrainListener {
 public:
  explicit ProgressPrinter(bool quiet);
  void onStep(const StepEvent& e) override;
  void onCheckpoint(int64_t step, const std::filesystem::path& dir) override;
  void onMessage(const std::string& message) override;
  void finish();

 private:
  bool quiet_;
  bool tty_;
  bool line_open_ = false;
  std::mutex mutex_;
};

// Writes training_loss.png when the config asks for it (plot_loss).
void plotIfAsked(const train::TrainConfig& config);

// Runs the job on its own thread, prints progress, maps Ctrl-C to stop / cancel.
train::TrainingRunOutcome runTrainingInForeground(const train::TrainConfig& config,
                                                  store::RunStore* store, bool quiet);

}  // namespace tandem::cli
