#include "engine/model/machine_probe.h"

namespace tandem::model {

placement::Hardware probeMachine(std::string* gpu_status) { return placement::probeHardware(gpu_status); }

}  // namespace tandem::model
