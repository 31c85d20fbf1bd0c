#pragma once
// Levelled, thread-safe logging. Lines go to stderr by default; the studio and the run store
// install a sink to receive them instead. Usage: logInfo() << "loaded " << n << " tensors";

#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace tandem {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

using LogSink = std::function<void(LogLevel, std::string_view line)>;

void setLogLevel(LogLevel level);
LogLevel logLevel();
// Replaces the sink (nullptr restores stderr). Called with the log lock held: keep it quick.
void setLogSink(LogSink sink);
void logMessage(LogLevel level, std::string_view text);
std::string_view logLevelName(LogLevel level);

// Collects one line and emits it when destroyed.
class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level), enabled_(level >= logLevel()) {}
  ~LogLine() {
    if (enabled_) logMessage(level_, stream_.str());
  }
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  template <typename T>
  LogLine& operator<<(const T& value) {
    if (enabled_) stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  bool enabled_;
  std::ostringstream stream_;
};

inline LogLine logDebug() { return LogLine(LogLevel::Debug); }
inline LogLine logInfo() { return LogLine(LogLevel::Info); }
inline LogLine logWarn() { return LogLine(LogLevel::Warn); }
inline LogLine logError() { return LogLine(LogLevel::Error); }

}  // namespace tandem
