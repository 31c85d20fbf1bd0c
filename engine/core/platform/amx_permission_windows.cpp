#include "engine/core/platform/amx_permission.h"

namespace tandem::platform {

// Windows 11 (and Server 2022) save the tile state for every thread once XCR0 enables it, which
// the caller has already checked; older Windows leaves XCR0's AMX bits clear.
AmxPermission requestAmxTileState() { return AmxPermission{.granted = true, .refusal = {}}; }

}  // namespace tandem::platform
