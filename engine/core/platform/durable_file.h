#pragma once
// The steps of a crash-safe file write (io::writeFileAtomically): create a fresh temp file, force
// its bytes to the disk, replace the target with it in one step, and make that replacement itself
// durable. Linux: open(O_EXCL) + fsync + rename(2) + fsync of the directory. Windows:
// CreateFileW(CREATE_NEW) + FlushFileBuffers + MoveFileExW(MOVEFILE_REPLACE_EXISTING |
// MOVEFILE_WRITE_THROUGH), which needs no separate directory flush. Failures come back as an
// std::error_code; the caller words the message.

#include <cstdio>
#include <filesystem>
#include <string_view>
#include <system_error>

namespace tandem::platform {

// A new file at `path` open for binary writing; fails (nullptr, `error` set) if anything, even a
// dangling symlink, is already there, so we never write through a file someone else put there.
std::FILE* createNewFileForWriting(const std::filesystem::path& path, std::error_code& error);

// Flushes the stream's buffers and the OS's cache of the file to the disk.
std::error_code flushFileToDisk(std::FILE* file);

// Renames `from` over `to` (same directory), replacing `to` in one step if it exists. Windows
// refuses (permission denied) while `to` is mapped (file_map.h); Linux replaces it and the
// mapping keeps the old contents.
std::error_code replaceFile(const std::filesystem::path& from, const std::filesystem::path& to);

// Makes a completed replaceFile in `dir` survive a power loss. File systems that cannot sync a
// directory (some FUSE or network mounts) are not an error: the rename already happened.
std::error_code flushDirectoryToDisk(const std::filesystem::path& dir);

// Appends `text` to `path` (created if missing) in one write, so that after a crash the file ends
// with the text whole or cut short, never interleaved with another writer's. Linux: O_APPEND +
// write(2). Windows: FILE_APPEND_DATA + one WriteFile. A short write is errc::io_error.
std::error_code appendInOneWrite(const std::filesystem::path& path, std::string_view text);

// Whether `error` means the disk (or quota) is full.
bool isDiskFull(const std::error_code& error);

}  // namespace tandem::platform
