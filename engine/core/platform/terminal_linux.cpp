#include <unistd.h>

#include "engine/core/platform/terminal.h"

namespace tandem::platform {

bool stdinIsTerminal() { return ::isatty(STDIN_FILENO) == 1; }
bool stdoutIsTerminal() { return ::isatty(STDOUT_FILENO) == 1; }

}  // namespace tandem::platform
