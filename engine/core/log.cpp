#include "engine/core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "engine/core/platform/local_time.h"

namespace tandem {

namespace {
std::atomic<LogLevel> g_level{LogLevel::Info};
std::mutex g_mutex;
LogSink g_sink;  // guarded by g_mutex

void writeToStderr(LogLevel level, std::string_view text) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const std::tm local = platform::localCalendarTime(seconds);
  char stamp[16];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &local);
  const std::string_view name = logLevelName(level);
  std::fprintf(stderr, "[%s %.*s] %.*s\n", stamp, static_cast<int>(name.size()), name.data(),
               static_cast<int>(text.size()), text.data());
}
}  // namespace

void setLogLevel(LogLevel level) { g_level.store(level); }
LogLevel logLevel() { return g_level.load(); }

void setLogSink(LogSink sink) {
  std::lock_guard lock(g_mutex);
  g_sink = std::move(sink);
}

void logMessage(LogLevel level, std::string_view text) {
  if (level < logLevel()) return;
  std::lock_guard lock(g_mutex);
  if (g_sink) {
    g_sink(level, text);
  } else {
    writeToStderr(level, text);
  }
}

std::string_view logLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::Debug: return "debug";
    case LogLevel::Info: return "info";
    case LogLevel::Warn: return "warn";
    case LogLevel::Error: return "error";
    case LogLevel::Off: return "off";
  }
  return "?";
}

}  // namespace tandem
