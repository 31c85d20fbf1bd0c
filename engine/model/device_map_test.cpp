#include "engine/model/device_map.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/model/model_options.h"
#include "engine/model/torch_device.h"

namespace tandem::model {
namespace {

using placement::Device;
const Device kCpu = Device::cpu();
const Device kNode0 = Device::numaNode(0);  // torch's cpu:0: the CPU build's second device object

TEST(DeviceMap, RangesSingleLayersAndTheFallback) {
  const auto devices = parseLayerDevices("cpu:0:1-2,cpu:4", 6, kNode0);
  const std::vector<Device> expected{kNode0, kNode0, kNode0, kNode0, kCpu, kNode0};
  EXPECT_EQ(devices, expected);
  EXPECT_EQ(parseLayerDevices("", 3, kCpu), std::vector<Device>(3, kCpu));
  EXPECT_EQ(parseLayerDevices("cpu:0-2,", 3, kNode0), std::vector<Device>(3, kCpu));
}

TEST(DeviceMap, FormatMergesRangesAndReadsBack) {
  const std::vector<Device> devices{kCpu, kCpu, kNode0, kNode0, kNode0, kCpu};
  const std::string text = formatLayerDevices(devices);
  EXPECT_EQ(text, "cpu:0-1,cpu:numa0:2-4,cpu:5");
  EXPECT_EQ(parseLayerDevices(text, 6, kNode0), devices);
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
  EXPECT_NE(message("meta:0-1").find("not a device"), std::string::npos);
}

// The runtime's side: a device libtorch does not have is refused when the model is built.
TEST(DeviceMap, TorchDevicesAreCheckedAgainstWhatLibtorchSees) {
  EXPECT_TRUE(torchDevice(kCpu).is_cpu());
  EXPECT_FALSE(torchDevice(kCpu).has_index());
  EXPECT_EQ(torchDevice(kNode0), c10::Device(c10::kCPU, 0));
  EXPECT_NE(torchDevice(kNode0),
            torchDevice(kCpu));  // two device objects: the multi-device paths run
  EXPECT_EQ(placementDevice(torchDevice(kNode0)), kNode0);
  try {
    torchDevice(Device::cuda(63));
    ADD_FAILURE() << "cuda:63 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not available"), std::string::npos) << e.what();
  }
}

TEST(DeviceMap, ExpertsModes) {
  EXPECT_EQ(parseExpertsMode("cpu"), ExpertsMode::Cpu);
  EXPECT_EQ(parseExpertsMode("gpu-offload"), ExpertsMode::GpuOffload);
  EXPECT_EQ(expertsModeName(ExpertsMode::GpuOffload), "gpu-offload");
  EXPECT_THROW(parseExpertsMode("offload"), Error);
}

}  // namespace
}  // namespace tandem::model
