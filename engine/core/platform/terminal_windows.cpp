#include <io.h>

#include <cstdio>

#include "engine/core/platform/terminal.h"

namespace tandem::platform {

bool stdinIsTerminal() { return _isatty(_fileno(stdin)) != 0; }
bool stdoutIsTerminal() { return _isatty(_fileno(stdout)) != 0; }

}  // namespace tandem::platform
