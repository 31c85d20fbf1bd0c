#include "engine/placement/device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "engine/core/error.h"

namespace tandem::placement {
namespace {

TEST(Device, ParsesEveryFormAndPrintsItBack) {
  for (const char* text : {"cpu", "cuda:0", "cuda:7", "cpu:numa0", "cpu:numa3"}) {
    EXPECT_EQ(Device::parse(text).str(), text);
  }
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cpu:0"), Device::numaNode(0));  // torch's spelling
  EXPECT_NE(Device::parse("cpu:0"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda:1").gpuIndex(), 1);
  EXPECT_EQ(Device::parse("cpu:numa2").numaNode(), 2);
  EXPECT_EQ(Device::parse("cpu:numa2").host(), Device::cpu());
  EXPECT_EQ(Device::cpu().numaNode(), -1);
  EXPECT_TRUE(Device::cuda(0).isGpu());
  EXPECT_FALSE(Device::numaNode(0).isGpu());
}

TEST(Device, RefusesWhatIsNotADeviceAndSaysWhere) {
  for (const char* text :
       {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "cpu:numa", "cpu:", "cpu:x", "mps", " cpu"}) {
    try {
      Device::parse(text, "layer 3");
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("layer 3"), std::string::npos) << e.message();
    }
  }
}

TEST(Device, SortsGpusBeforeTheHost) {
  std::vector<Device> devices = {Device::numaNode(1), Device::cpu(), Device::cuda(1),
                                 Device::cuda(0), Device::numaNode(0)};
  std::sort(devices.begin(), devices.end());
  std::vector<std::string> names;
  for (const Device& d : devices) names.push_back(d.str());
  EXPECT_EQ(names, (std::vector<std::string>{"cuda:0", "cuda:1", "cpu", "cpu:numa0", "cpu:numa1"}));
}

}  // namespace
}  // namespace tandem::placement
