#pragma once
// This process and machine as the run store records them, and whether a recorded process still
// lives. Linux: getpid, gethostname, /proc/sys/kernel/random/boot_id, kill(pid, 0),
// readlink(/proc/self/exe). Windows: GetCurrentProcessId, GetUserNameW, GetComputerNameW,
// OpenProcess + GetExitCodeProcess, GetModuleFileNameW; no boot id.

#include <cstdint>
#include <filesystem>
#include <string>

namespace tandem::platform {

int64_t currentProcessId();

// Tells this user's files from another's in a shared place (a temp dir name): the uid on Linux,
// the account name on Windows (GetUserNameW).
std::string currentUserTag();

// The machine's name; empty when the OS does not say.
std::string hostName();

// Changes on every boot, so a pid recorded before a reboot can be told from a live process that
// has the same pid now. Empty where the OS has no such id (Windows): callers then skip the check.
std::string bootId();

// True only when the OS says no process `pid` exists; a process of another user counts as alive.
bool processIsGone(int64_t pid);

// The running executable's absolute path; empty when the OS does not say.
std::filesystem::path executablePath();

}  // namespace tandem::platform
