#include "engine/model/device_map.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace tandem::model {
namespace {

const c10::Device kCpu(c10::kCPU);
const c10::Device kCpu0(c10::kCPU, 0);

TEST(DeviceMap, RangesSingleLayersAndTheFallback) {
  const auto devices = parseLayerDevices("cpu:0:1-2,cpu:4", 6, kCpu0);
  const std::vector<c10::Device> expected{kCpu0, kCpu0, kCpu0, kCpu0, kCpu, kCpu0};
  EXPECT_EQ(devices, expected);
  EXPECT_EQ(parseLayerDevices("", 3, kCpu), std::vector<c10::Device>(3, kCpu));
  EXPECT_EQ(parseLayerDevices("cpu:0-2,", 3, kCpu0), std::vector<c10::Device>(3, kCpu));
}

TEST(DeviceMap, FormatMergesRangesAndReadsBack) {
  const std::vector<c10::Device> devices{kCpu, kCpu, kCpu0, kCpu0, kCpu0, kCpu};
  const std::string text = formatLayerDevices(devices);
  EXPECT_EQ(text, "cpu:0-1,cpu:0:2-4,cpu:5");
  EXPECT_EQ(parseLayerDevices(text, 6, kCpu0), devices);
}

TEST(DeviceMap, BadTextNamesTheItem) {
  auto message = [](const std::string& text) {
    try {
      parseLayerDevices(text, 4, kCpu);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("cpu:0-9").find("outside the model's 0-3"), std::string::npos);
  EXPECT_NE(message("cpu:2-1").find("not a layer range"), std::string::npos);
  EXPECT_NE(message("cpu:x").find("not a layer range"), std::string::npos);
  EXPECT_NE(message("cpu").find("names no layers"), std::string::npos);
  EXPECT_NE(message("cpu:0-1,,cpu:2").find("empty item"), std::string::npos);
  EXPECT_NE(message("cpu:0-2,cpu:0:2-3").find("layer 2 is placed twice"), std::string::npos);
  EXPECT_NE(message("gpu:0-1").find("not a device"), std::string::npos);
  EXPECT_NE(message("meta:0-1").find("not one Tandem runs on"), std::string::npos);
  EXPECT_NE(message("cuda:63:0-1").find("not available"), std::string::npos);
}

TEST(DeviceMap, ExpertsModes) {
  EXPECT_EQ(parseExpertsMode("cpu"), ExpertsMode::Cpu);
  EXPECT_EQ(parseExpertsMode("gpu-offload"), ExpertsMode::GpuOffload);
  EXPECT_EQ(expertsModeName(ExpertsMode::GpuOffload), "gpu-offload");
  EXPECT_THROW(parseExpertsMode("offload"), Error);
}

}  // namespace
}  // namespace tandem::model
