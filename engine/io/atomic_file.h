#pragma once
// Atomic file replacement: the target either keeps its old content or gets the complete new
// content, even if the process is killed mid-write (DESIGN.md "Errors": writes are temp + rename).
//
// The body is written to a uniquely named temp file in the target's directory (same file system,
// so rename(2) is atomic), flushed and fsync'ed, renamed over the target, and the directory is
// fsync'ed so the rename itself survives a power loss.

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string_view>

namespace tandem::io {

// Calls write_body with the temp file open for binary writing. Any exception from write_body, or
// a failed write/flush/fsync/rename, removes the temp file and leaves the target untouched. I/O
// failures throw tandem::Error naming the path and the system's reason; exceptions thrown by
// write_body propagate unchanged. write_body may write with fwrite; errors are detected via
// ferror/fflush afterwards, so it does not need to check every call.
void writeFileAtomically(const std::filesystem::path& path,
                         const std::function<void(std::FILE*)>& write_body);

void writeFileAtomically(const std::filesystem::path& path, std::string_view contents);

}  // namespace tandem::io
