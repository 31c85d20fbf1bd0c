#include <windows.h>

#include <vector>

#include "engine/core/platform/process_info.h"

namespace tandem::platform {

int64_t currentProcessId() { return static_cast<int64_t>(GetCurrentProcessId()); }

std::string currentUserTag() {
  wchar_t buf[257] = {};  // UNLEN + 1
  DWORD size = 257;
  if (!GetUserNameW(buf, &size) || size == 0) return "user";
  return std::filesystem::path(std::wstring(buf, size - 1)).string();
}

std::string hostName() {
  wchar_t buf[MAX_COMPUTERNAME_LENGTH + 1] = {};
  DWORD size = MAX_COMPUTERNAME_LENGTH + 1;
  if (!GetComputerNameW(buf, &size)) return "";
  return std::filesystem::path(std::wstring(buf, size)).string();
}

std::string bootId() { return ""; }

bool processIsGone(int64_t pid) {
  if (pid <= 0 || pid > 0xffffffffLL) return false;
  HANDLE process = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, FALSE, static_cast<DWORD>(pid));
  if (process == nullptr) return GetLastError() == ERROR_INVALID_PARAMETER;  // no such pid
  DWORD exit_code = 0;
  const bool exited = GetExitCodeProcess(process, &exit_code) && exit_code != STILL_ACTIVE;
  CloseHandle(process);
  return exited;
}

std::filesystem::path executablePath() {
  std::vector<wchar_t> buf(MAX_PATH);
  for (;;) {
    const DWORD n = GetModuleFileNameW(nullptr, buf.data(), static_cast<DWORD>(buf.size()));
    if (n == 0) return {};
    if (n < buf.size()) return std::filesystem::path(std::wstring(buf.data(), n));
    buf.resize(buf.size() * 2);  // truncated: try a bigger buffer
  }
}

}  // namespace tandem::platform
