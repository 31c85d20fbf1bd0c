#pragma once
// How a training job ended, as it crosses from the training thread to the GUI thread in a queued
// signal. Steps cross as the engine's own StepEvent (engine/core/train_events.h, torch-free).

#include <QMetaType>
#include <QString>
#include <cstdint>
#include <vector>

#include "engine/core/train_events.h"

namespace tandem::ui {

enum class TrainEnd { Completed, Stopped, Cancelled, Failed };

struct TrainFinish {
  TrainEnd end = TrainEnd::Completed;
  int64_t steps = 0;
  double final_loss = 0;
  int64_t run_id = 0;  // in the run store; 0 when it failed before one was made
  QString output_dir;
  QString error;       // Failed: what is wrong
  QString what_to_do;  // Failed: what the user can do about it
};

QString trainEndName(TrainEnd end);  // "completed", "stopped", ...

}  // namespace tandem::ui

Q_DECLARE_METATYPE(tandem::StepEvent)
Q_DECLARE_METATYPE(tandem::ui::TrainFinish)
Q_DECLARE_METATYPE(tandem::MemorySnapshot)
