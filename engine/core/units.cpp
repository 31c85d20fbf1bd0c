#include "engine/core/units.h"

#include <cstdio>

namespace tandem {

namespace {
std::string scaled(double value, const char* unit) {
  char text[32];
  // Three significant digits: 1.23, 12.3, 123.
  const char* format = value < 10 ? "%.2f %s" : value < 100 ? "%.1f %s" : "%.0f %s";
  std::snprintf(text, sizeof text, format, value, unit);
  return text;
}
}  // namespace

std::string formatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return scaled(value, kUnits[unit]);
}

std::string formatCount(uint64_t count) {
  static const char* const kUnits[] = {"K", "M", "B", "T"};
  if (count < 1000) return std::to_string(count);
  double value = static_cast<double>(count) / 1000.0;
  int unit = 0;
  while (value >= 1000.0 && unit < 3) {
    value /= 1000.0;
    ++unit;
  }
  return scaled(value, kUnits[unit]);
}

std::string formatDuration(double seconds) {
  const long long s = seconds > 0 ? static_cast<long long>(seconds + 0.5) : 0;
  char text[32];
  std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return text;
}

std::string formatShape(std::span<const int64_t> shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

}  // namespace tandem
