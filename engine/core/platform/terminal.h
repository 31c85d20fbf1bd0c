#pragma once
// Whether the standard streams are an interactive terminal (progress bars, prompts). Linux:
// isatty. Windows: _isatty (true for a console, false for a pipe or file).

namespace tandem::platform {

bool stdinIsTerminal();
bool stdoutIsTerminal();

}  // namespace tandem::platform
