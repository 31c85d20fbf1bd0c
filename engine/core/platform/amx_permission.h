#pragma once
// The OS's grant of the AMX tile state (XTILEDATA) to this process. Linux >= 5.16 hands it out
// only on request (arch_prctl(ARCH_REQ_XCOMP_PERM)); without it the first tile instruction
// faults. Windows 11 enables the state for every process that XCR0 allows, so there is nothing to
// ask for. Call once per process; the grant is permanent.

#include <string>

namespace tandem::platform {

struct AmxPermission {
  bool granted = false;
  std::string refusal;  // why not, for the user; empty when granted
};

AmxPermission requestAmxTileState();

}  // namespace tandem::platform
