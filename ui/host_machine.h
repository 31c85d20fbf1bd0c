#pragma once
// HostMachine: the machine the studio runs on, probed on a worker thread (the GPU probe starts
// CUDA, which can take seconds): what the studio shows about it (MachineInfo, as `tandem info`)
// and what the memory planner plans for (placement::Hardware). The one place in ui/ that probes.

#include <QObject>
#include <QString>

#include "engine/placement/hardware.h"
#include "ui/engine_worker.h"
#include "ui/machine_info.h"

namespace tandem::ui {

class HostMachine : public QObject {
  Q_OBJECT

 public:
  explicit HostMachine(QObject* parent = nullptr);  // starts the first probe

  bool isProbed() const { return probed_; }
  bool isBusy() const { return !worker_.isIdle(); }
  // Empty (no GPU, no NUMA node) until the first probe arrives; a later probe updates them in
  // place, so references to them stay valid.
  const MachineInfo& info() const { return info_; }
  const placement::Hardware& hardware() const { return hardware_; }
  // Why the last probe failed; empty when it did not.
  const QString& problem() const { return problem_; }

 public slots:
  void probe();  // again: free memory changes

 signals:
  void probed();  // a probe arrived (or failed: problem())

 private:
  MachineInfo info_;
  placement::Hardware hardware_;
  QString problem_;
  bool probed_ = false;
  EngineWorker worker_{this};
};

}  // namespace tandem::ui
