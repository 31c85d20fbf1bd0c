#include "ui/host_machine.h"

#include "engine/model/machine_probe.h"

namespace tandem::ui {

namespace {

struct MachineProbe {
  MachineInfo info;
  placement::Hardware hardware;
};

MachineProbe probeThisMachine() { return {detectMachine(), model::probeMachine()}; }

}  // namespace

HostMachine::HostMachine(QObject* parent) : QObject(parent) { probe(); }

void HostMachine::probe() {
  worker_.request(probeThisMachine, [this](EngineResult<MachineProbe> result) {
    probed_ = true;
    problem_ = result.error;
    if (result.ok()) {
      info_ = std::move(result.value->info);
      hardware_ = std::move(result.value->hardware);
    }
    emit probed();
  });
}

}  // namespace tandem::ui
