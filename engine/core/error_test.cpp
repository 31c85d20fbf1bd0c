#include "engine/core/error.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/core/log.h"

namespace tandem {
namespace {

TEST(Error, CarriesMessageAndWhatToDo) {
  const Error e("tensor x has 3 dims", "re-export the model");
  EXPECT_EQ(e.message(), "tensor x has 3 dims");
  EXPECT_EQ(e.whatToDo(), "re-export the model");
  EXPECT_NE(std::string(e.what()).find("what to do: re-export"), std::string::npos);
  EXPECT_EQ(std::string(Error("plain").what()), "plain");
}

TEST(Log, SinkReceivesLinesAtOrAboveLevel) {
  std::vector<std::pair<LogLevel, std::string>> lines;
  setLogSink([&](LogLevel level, std::string_view text) { lines.emplace_back(level, text); });
  setLogLevel(LogLevel::Info);
  logDebug() << "hidden";
  logInfo() << "loaded " << 3 << " tensors";
  logWarn() << "careful";
  setLogSink(nullptr);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].second, "loaded 3 tensors");
  EXPECT_EQ(lines[1].first, LogLevel::Warn);
}

}  // namespace
}  // namespace tandem
