#include "engine/model/machine_doctor.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/gpu/torch_runtime.h"

namespace tandem::model {
namespace {

TEST(MachineDoctor, RunsEveryCheckOnThisMachine) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const MachineReport report = checkThisMachine(dir);
  std::vector<std::string> ids;
  for (const MachineCheck& check : report.checks) {
    ids.push_back(check.id);
    EXPECT_FALSE(check.finding.empty()) << check.id;
    // Whatever is not ok says what to do.
    EXPECT_EQ(check.fix.empty(), check.status == CheckStatus::Ok) << check.id;
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"cpu", "numa", "huge_pages", "gpu", "disk", "locale"}));
  const MachineCheck& disk = report.checks[4];
  EXPECT_NE(disk.finding.find(dir.string()), std::string::npos) << disk.finding;
  // No GPU is a warning with a clear line, never a failure.
  const MachineCheck& gpu = report.checks[3];
  EXPECT_NE(gpu.status, CheckStatus::Fail) << gpu.finding;
  if (gpu::probeTorchRuntime().gpus.empty()) {
    EXPECT_NE(gpu.finding.find("training runs on the CPU"), std::string::npos) << gpu.finding;
  }
}

}  // namespace
}  // namespace tandem::model
