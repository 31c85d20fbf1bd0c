#include "engine/core/platform/process_memory.h"

namespace tandem::platform {

// Windows has no per-node view of a process's pages short of QueryWorkingSetEx over every page;
// the memory map then shows the process's share as not known per node.
std::string processNumaMapsText() { return {}; }

uint64_t numaNodeReclaimableBytes(int) { return 0; }

}  // namespace tandem::platform
