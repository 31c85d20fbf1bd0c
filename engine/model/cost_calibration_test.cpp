// Training start-up's calibration for experts_mode auto: measured once (a progress line, the
// result line), written to the cache, and read from it on the next start without measuring.

#include "engine/model/cost_calibration.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/core/thread_pool.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

class CalibrateAtStartup : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tandem-calibration-test-" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A small expert shape: the synthetic layer stays small, the measurement short.
  CalibrationOptions options() const {
    CalibrationOptions o;
    o.hidden = 256;
    o.intermediate = 128;
    o.cache_dir = dir_;
    return o;
  }

  fs::path dir_;
};

TEST_F(CalibrateAtStartup, MeasuresOnceThenReadsTheCache) {
  std::vector<std::string> lines;
  auto log = [&](const std::string& line) { lines.push_back(line); };
  const Calibration first = calibrateAtStartup(options(), ThreadPool::global(), log);
  EXPECT_FALSE(first.from_cache);
  EXPECT_GT(first.measured_s, 0.0);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("calibrating"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find(first.cache_file.string()), std::string::npos) << lines[1];
  EXPECT_TRUE(fs::exists(first.cache_file));
  EXPECT_EQ(first.cache_file.parent_path().parent_path(), dir_);
  ASSERT_EQ(first.rates.cpu.size(), 1u);
  const placement::RateCurve& curve = first.rates.cpu[0].curve;
  ASSERT_EQ(curve.points.size(), 4u);  // 1, 8, 64, 512 tokens per expert
  for (const placement::RatePoint& p : curve.points) {
    EXPECT_GT(p.forward_flops_per_s, 0.0);
    EXPECT_GT(p.backward_flops_per_s, 0.0);
  }
  bool quick_noted = false;
  for (const std::string& note : first.rates.notes)
    quick_noted = quick_noted || note.find("quick") != std::string::npos;
  EXPECT_TRUE(quick_noted);

  const Calibration second = calibrateAtStartup(options(), ThreadPool::global(), log);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.measured_s, 0.0);
  EXPECT_EQ(lines.size(), 2u);  // nothing measured, nothing said
  EXPECT_EQ(second.cache_file, first.cache_file);
  ASSERT_EQ(second.rates.cpu.size(), 1u);
  for (size_t i = 0; i < curve.points.size(); ++i) {
    EXPECT_DOUBLE_EQ(second.rates.cpu[0].curve.points[i].forward_flops_per_s,
                     curve.points[i].forward_flops_per_s);
  }

  // Another expert shape is another key: measured again.
  CalibrationOptions other = options();
  other.intermediate = 64;
  EXPECT_FALSE(calibrateAtStartup(other, ThreadPool::global(), log).from_cache);
  EXPECT_EQ(lines.size(), 4u);
}

}  // namespace
}  // namespace tandem::model
