#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/core/platform/amx_permission.h"

namespace tandem::platform {

namespace {
// Linux ABI constants (asm/prctl.h, asm/fpu/xstate.h); spelled out so old headers still build.
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtileData = 18;
}  // namespace

AmxPermission requestAmxTileState() {
  AmxPermission p;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) != 0) {
    p.refusal = std::string("the kernel refused the AMX permission (arch_prctl: ") +
                std::strerror(errno) + "); Linux 5.16 or newer is needed";
    return p;
  }
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0 ||
      !(granted & (1ul << kXfeatureXtileData))) {
    p.refusal = "the kernel did not grant the AMX tile state";
    return p;
  }
  p.granted = true;
  return p;
}

}  // namespace tandem::platform
