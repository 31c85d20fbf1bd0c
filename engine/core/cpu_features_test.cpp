#include "engine/core/cpu_features.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "engine/core/error.h"

namespace tandem {
namespace {

// The kernel's own view of the CPU flags: an independent reference for our CPUID decoding.
std::set<std::string> procCpuinfoFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      std::set<std::string> flags;
      for (std::string w; words >> w;) flags.insert(w);
      return flags;
    }
  }
  return {};
}

TEST(CpuFeatures, MatchesProcCpuinfo) {
  const auto flags = procCpuinfoFlags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line";
  const CpuFeatures f = detectCpuFeatures(IsaLevel::Amx);
  EXPECT_EQ(f.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(f.fma, flags.count("fma") == 1);
  EXPECT_EQ(f.avx512f, flags.count("avx512f") == 1);
  EXPECT_EQ(f.avx512bw, flags.count("avx512bw") == 1);
  EXPECT_EQ(f.avx512vl, flags.count("avx512vl") == 1);
  EXPECT_EQ(f.avx512_bf16, flags.count("avx512_bf16") == 1);
  EXPECT_EQ(f.avx512_fp16, flags.count("avx512_fp16") == 1);
  EXPECT_EQ(f.amx_tile, flags.count("amx_tile") == 1);
  EXPECT_EQ(f.amx_bf16, flags.count("amx_bf16") == 1);
  EXPECT_EQ(f.amx_int8, flags.count("amx_int8") == 1);
  EXPECT_GE(f.logical_cpus, 1);
  EXPECT_FALSE(f.vendor.empty());
  EXPECT_FALSE(f.amx_status.empty());
}

// Executes real tile instructions: faults (the test crashes) if the permission was not granted.
__attribute__((target("amx-tile"))) void touchTiles() {
  alignas(64) unsigned char config[64] = {};
  config[0] = 1;    // palette 1
  config[16] = 64;  // tile 0: 64 bytes per row
  config[48] = 16;  // tile 0: 16 rows
  _tile_loadconfig(config);
  _tile_zero(0);
  _tile_release();
}

TEST(CpuFeatures, AmxPermissionLetsTilesRun) {
  const CpuFeatures& f = cpuFeatures();
  if (!f.canUseAmxBf16()) GTEST_SKIP() << "AMX not usable here: " << f.amx_status;
  EXPECT_TRUE(f.amx_permitted);
  touchTiles();
}

TEST(CpuFeatures, CapDisablesHigherLevels) {
  const CpuFeatures generic = detectCpuFeatures(IsaLevel::Generic);
  EXPECT_FALSE(generic.canUseAvx2());
  EXPECT_FALSE(generic.canUseAvx512());
  EXPECT_FALSE(generic.canUseAmxBf16());
  EXPECT_EQ(generic.bestLevel(), IsaLevel::Generic);
  EXPECT_NE(generic.amx_status.find("TANDEM_CPU_ISA"), std::string::npos);

  const CpuFeatures avx2 = detectCpuFeatures(IsaLevel::Avx2);
  EXPECT_FALSE(avx2.canUseAvx512());
  EXPECT_LE(static_cast<int>(avx2.bestLevel()), static_cast<int>(IsaLevel::Avx2));

  const CpuFeatures all = detectCpuFeatures(IsaLevel::Amx);
  if (all.canUseAvx512Bf16()) {
    const CpuFeatures capped = detectCpuFeatures(IsaLevel::Avx512);
    EXPECT_FALSE(capped.canUseAvx512Bf16());
    EXPECT_TRUE(capped.canUseAvx512());
  }
}

TEST(CpuFeatures, IsaNamesRoundTripAndBadNamesAreErrors) {
  for (IsaLevel level :
       {IsaLevel::Generic, IsaLevel::Avx2, IsaLevel::Avx512, IsaLevel::Avx512Bf16, IsaLevel::Amx}) {
    EXPECT_EQ(parseIsaLevel(isaLevelName(level)), level);
  }
  try {
    parseIsaLevel("avx9000");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.whatToDo().find("avx512_bf16"), std::string::npos);
  }
}

}  // namespace
}  // namespace tandem
