#pragma once
// Value types that cross from the training thread to the GUI thread in queued signals. They copy
// what the widgets need out of the engine's StepEvent, so no widget header includes the trainer
// (and through it ATen).

#include <QMetaType>
#include <QString>
#include <cstdint>
#include <vector>

#include "engine/core/memory_ledger.h"

namespace tandem::ui {

struct TrainPoint {
  int64_t step = 0;  // optimizer steps done
  int64_t total_steps = 0;
  double epoch = 0;
  double loss = 0;
  double learning_rate = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;
  double elapsed_s = 0;
  double eta_s = 0;
  std::vector<DeviceMemoryUsage> memory;  // the engine's byte accounting at this step
};

enum class TrainEnd { Completed, Stopped, Cancelled, Failed };

struct TrainFinish {
  TrainEnd end = TrainEnd::Completed;
  int64_t steps = 0;
  double final_loss = 0;
  int64_t run_id = 0;     // in the run store; 0 when it failed before one was made
  QString output_dir;
  QString error;          // Failed: what is wrong
  QString what_to_do;     // Failed: what the user can do about it
};

QString trainEndName(TrainEnd end);  // "completed", "stopped", ...

}  // namespace tandem::ui

Q_DECLARE_METATYPE(tandem::ui::TrainPoint)
Q_DECLARE_METATYPE(tandem::ui::TrainFinish)
