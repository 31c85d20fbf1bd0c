#include "engine/placement/calibration_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

namespace tandem::placement {
namespace {

namespace fs = std::filesystem;

CalibrationKey someKey() {
  CalibrationKey key;
  key.cpu_model = "Intel Xeon Platinum 8480+";
  key.cpu_cores = 16;
  key.gpu_names = {"NVIDIA H200"};
  key.torch_version = "2.11.0";
  key.cuda_version = "13.0";
  key.tandem_version = "0.1.0";
  key.hidden = 2048;
  key.intermediate = 768;
  return key;
}

MachineRates someRates() {
  MachineRates rates;
  rates.source = "calibrated";
  rates.cpu.push_back(
      {"amx_bf16", "bf16", {{{1, 0.1e12, 0.08e12}, {64, 2e12, 1.6e12}, {512, 4e12, 3.3e12}}}});
  rates.cpu.push_back({"amx_int8", "int8", {{{1, 0.2e12, 0.15e12}, {512, 4.5e12, 3.5e12}}}});
  rates.cpu[0].forward_call_ms = 0.05;
  rates.cpu[0].backward_call_ms = 0.08;
  rates.host_memory_bytes_per_s = 120e9;
  rates.cpu_dense_flops_per_s = 3.2e12;
  GpuRates gpu;
  gpu.index = 0;
  gpu.name = "NVIDIA H200";
  gpu.host_to_device_bytes_per_s = 54e9;
  gpu.device_to_host_bytes_per_s = 50e9;
  gpu.expert_gemm = {{{1, 5e12, 5e12}, {512, 600e12, 600e12}}};
  gpu.dense_flops_per_s = 700e12;
  rates.gpus.push_back(gpu);
  rates.notes = {"measured"};
  return rates;
}

struct CacheDir : ::testing::Test {
  void SetUp() override {
    dir = fs::temp_directory_path() / ("tandem_calibration_test_" + std::to_string(::getpid()));
    fs::remove_all(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

TEST_F(CacheDir, RoundTripKeepsEveryRate) {
  const MachineRates rates = someRates();
  writeCalibrationCache(rates, someKey(), dir);
  const std::optional<MachineRates> back = readCalibrationCache(someKey(), dir);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->source, "cache");
  ASSERT_EQ(back->cpu.size(), 2u);
  EXPECT_EQ(back->cpu[1].backend, "amx_int8");
  ASSERT_EQ(back->cpu[0].curve.points.size(), 3u);
  EXPECT_DOUBLE_EQ(back->cpu[0].curve.points[1].backward_flops_per_s, 1.6e12);
  EXPECT_DOUBLE_EQ(back->cpu[0].forward_call_ms, 0.05);
  EXPECT_DOUBLE_EQ(back->cpu[0].backward_call_ms, 0.08);
  EXPECT_DOUBLE_EQ(back->host_memory_bytes_per_s, 120e9);
  EXPECT_DOUBLE_EQ(back->cpu_dense_flops_per_s, 3.2e12);
  ASSERT_EQ(back->gpus.size(), 1u);
  EXPECT_EQ(back->gpus[0].name, "NVIDIA H200");
  EXPECT_DOUBLE_EQ(back->gpus[0].device_to_host_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(back->gpus[0].expert_gemm.points[1].forward_flops_per_s, 600e12);
  EXPECT_DOUBLE_EQ(back->gpus[0].dense_flops_per_s, 700e12);
  EXPECT_EQ(back->notes, rates.notes);
}

TEST_F(CacheDir, AnyKeyChangeMissesTheCache) {
  writeCalibrationCache(someRates(), someKey(), dir);
  std::vector<CalibrationKey> changed(7, someKey());
  changed[0].cpu_model = "AMD EPYC 9654";
  changed[1].cpu_cores = 32;
  changed[2].gpu_names = {"NVIDIA H200", "NVIDIA H200"};
  changed[3].torch_version = "2.12.0";
  changed[4].cuda_version = "";
  changed[5].tandem_version = "0.2.0";
  changed[6].intermediate = 1408;
  for (const CalibrationKey& key : changed) {
    EXPECT_NE(calibrationCachePath(key, dir), calibrationCachePath(someKey(), dir)) << key.text();
    EXPECT_FALSE(readCalibrationCache(key, dir).has_value()) << key.text();
  }
  // The file of one key, moved under another key's name, is not taken for it either.
  fs::rename(calibrationCachePath(someKey(), dir), calibrationCachePath(changed[5], dir));
  EXPECT_FALSE(readCalibrationCache(changed[5], dir).has_value());
}

TEST_F(CacheDir, CorruptOrImpossibleFilesAreNoCache) {
  const CalibrationKey key = someKey();
  EXPECT_FALSE(readCalibrationCache(key, dir).has_value());  // missing
  const std::string good = machineRatesToJson(someRates(), key);
  fs::create_directories(calibrationCachePath(key, dir).parent_path());
  auto write = [&](const std::string& text) {
    std::ofstream(calibrationCachePath(key, dir), std::ios::binary) << text;
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  for (const std::string& bad :
       {good.substr(0, good.size() / 2), std::string("\0\1\2garbage", 10), std::string("[]"),
        std::string("{}"), replaced("\"format_version\": 1", "\"format_version\": 99"),
        replaced("120000000000.0", "-1.0"), replaced("\"host_memory_bytes_per_s\"", "\"x\""),
        replaced("\"backend\": \"amx_bf16\"", "\"backend\": 5"),
        replaced("600000000000000.0", "0.0"),
        replaced("\"backward_call_ms\": 0.08", "\"backward_call_ms\": -1"),
        replaced("\"forward_call_ms\"", "\"call_ms\"")}) {
    write(bad);
    EXPECT_FALSE(readCalibrationCache(key, dir).has_value()) << bad.substr(0, 80);
  }
  write(good);
  EXPECT_TRUE(readCalibrationCache(key, dir).has_value());
  // Overwriting after a corrupt file (what re-measuring does) works.
  write("{");
  writeCalibrationCache(someRates(), key, dir);
  EXPECT_TRUE(readCalibrationCache(key, dir).has_value());
}

TEST(RateCurve, InterpolatesInLogTokensAndClampsAtTheEnds) {
  const RateCurve curve{{{1, 1e9, 2e9}, {64, 7e9, 8e9}}};
  EXPECT_DOUBLE_EQ(curve.forwardRate(0.5), 1e9);
  EXPECT_DOUBLE_EQ(curve.forwardRate(1000), 7e9);
  EXPECT_NEAR(curve.forwardRate(8), 1e9 + 0.5 * 6e9, 1);  // log(8) is half of log(64)
  EXPECT_NEAR(curve.backwardRate(8), 2e9 + 0.5 * 6e9, 1);
  EXPECT_EQ(RateCurve{}.forwardRate(8), 0);
}

}  // namespace
}  // namespace tandem::placement
