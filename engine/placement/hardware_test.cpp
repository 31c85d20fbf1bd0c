#include "engine/placement/hardware.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace tandem::placement {
namespace {

const std::filesystem::path kPresets = std::filesystem::path(TANDEM_PRESETS_DIR) / "hardware";

std::string errorOf(const std::string& yaml) {
  try {
    parseHardwarePreset(yaml, "test.yaml");
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

const char* kValid = R"(
name: two cards
gpus:
  - {model: RTX 4090, memory_gib: 24, count: 2, pcie_gen: 4, pcie_lanes: 16}
cpu: {model: Xeon, vendor: intel, sockets: 2, cores_per_socket: 32, isa: [avx2, avx512, avx512_bf16, amx_bf16, amx_int8]}
memory: {total_gib: 512}
)";

TEST(HardwarePreset, EveryShippedPresetLoads) {
  const auto files = listHardwarePresets(kPresets);
  ASSERT_GE(files.size(), 12u);
  bool amd = false, avx2_only = false, amx_two_sockets = false, ram_256 = false, ram_2t = false;
  for (const auto& file : files) {
    SCOPED_TRACE(file.string());
    const Hardware hw = loadHardwarePreset(file);
    EXPECT_FALSE(hw.name.empty());
    EXPECT_FALSE(hw.gpus.empty());
    EXPECT_EQ(hw.numa_nodes.size(), static_cast<size_t>(hw.cpu.sockets));
    EXPECT_GE(hw.ramBytes(), uint64_t{127} << 30);
    // EPYC Genoa / Turin have AVX-512 (BF16) but no AMX, Milan AVX2 only; every Xeon preset here
    // has AMX.
    EXPECT_TRUE(hw.cpu.avx2);
    if (hw.cpu.vendor == "amd") {
      amd = true;
      EXPECT_FALSE(hw.cpu.amx_bf16);
      EXPECT_EQ(hw.cpu.avx512_bf16, hw.cpu.avx512);
      avx2_only |= !hw.cpu.avx512;
    } else {
      EXPECT_TRUE(hw.cpu.amx_int8);
    }
    amx_two_sockets |= hw.cpu.amx_bf16 && hw.cpu.sockets == 2;
    ram_256 |= hw.ramBytes() == uint64_t{256} << 30;
    ram_2t |= hw.ramBytes() == uint64_t{2048} << 30;
    // The preset written back reads as the same machine.
    const Hardware again = parseHardwarePreset(hardwareToYaml(hw), "again");
    EXPECT_EQ(again.gpus.size(), hw.gpus.size());
    EXPECT_EQ(again.ramBytes() >> 20, hw.ramBytes() >> 20);
    EXPECT_EQ(again.cpu.physical_cores, hw.cpu.physical_cores);
    EXPECT_EQ(again.cpu.amx_int8, hw.cpu.amx_int8);
  }
  EXPECT_TRUE(amd && avx2_only && amx_two_sockets && ram_256 && ram_2t);
}

TEST(HardwarePreset, ReadsTheSchema) {
  const Hardware hw = parseHardwarePreset(kValid, "test.yaml");
  ASSERT_EQ(hw.gpus.size(), 2u);
  EXPECT_EQ(hw.gpus[1].device().str(), "cuda:1");
  EXPECT_EQ(hw.gpus[0].total_bytes, uint64_t{24} << 30);
  EXPECT_EQ(hw.gpus[0].pcie_gen, 4);
  EXPECT_EQ(hw.cpu.physical_cores, 64);
  ASSERT_EQ(hw.numa_nodes.size(), 2u);
  EXPECT_EQ(hw.numa_nodes[1].total_bytes, uint64_t{256} << 30);
  EXPECT_EQ(hw.numa_nodes[1].cores, 32);
}

TEST(HardwarePreset, ErrorsNameFileKeyAndProblem) {
  std::string bad = kValid;
  EXPECT_EQ(errorOf(bad.replace(bad.find("memory_gib: 24"), 14, "memory_gib: -1")),
            "test.yaml: gpus[0].memory_gib: must be above 0, is -1");
  bad = kValid;
  EXPECT_EQ(errorOf(bad.replace(bad.find("amx_int8]"), 9, "amx_int4]")),
            "test.yaml: cpu.isa[4]: unknown instruction set 'amx_int4'");
  bad = kValid;
  EXPECT_EQ(errorOf(bad.replace(bad.find("total_gib"), 9, "total_gb")),
            "test.yaml: memory: unknown key 'total_gb'");
  EXPECT_EQ(errorOf("name: x\ngpus: []\n"), "test.yaml: cpu: is missing");
  EXPECT_EQ(
      errorOf("- a\n"),
      "test.yaml: (top level): must be a block of `key: value` lines (name, gpus, cpu, memory)");
  EXPECT_NE(errorOf("name: [\n").find("not valid YAML"), std::string::npos);
  bad = kValid;
  EXPECT_EQ(errorOf(bad.replace(bad.find("isa: [avx2, avx512, "), 20, "isa: [avx2, ")),
            "test.yaml: cpu.isa: lists AMX or AVX-512 BF16 without avx512");
}

TEST(HardwarePreset, ResolvesNamesAndListsKnownOnes) {
  EXPECT_EQ(resolveHardware("1x4090-24g_xeon-w7-spr_256g", kPresets).gpus.size(), 1u);
  try {
    resolveHardware("no-such-box", kPresets);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.whatToDo().find("2x4090-24g_xeon-spr-2s_512g"), std::string::npos);
  }
}

// This machine's CPU and NUMA nodes, with the GPUs it is given (engine/model's probeMachine gives
// libtorch's; its test checks those).
TEST(HardwareProbe, SeesThisMachineWithTheGpusGiven) {
  const GpuSpec card{0, "a 24 GB card", uint64_t{24} << 30, uint64_t{20} << 30, 4, 16};
  const Hardware hw = probeHardware({card});
  EXPECT_EQ(hw.source, "probe");
  ASSERT_FALSE(hw.numa_nodes.empty());
  EXPECT_GT(hw.ramBytes(), 0u);
  EXPECT_GE(hw.cpu.physical_cores, 1);
  ASSERT_EQ(hw.gpus.size(), 1u);
  EXPECT_EQ(hw.gpus[0].device().str(), "cuda:0");
  EXPECT_EQ(hw.gpus[0].free_bytes, card.free_bytes);
  EXPECT_EQ(hw.gpus[0].pcie_gen, 4);
  EXPECT_TRUE(probeHardware({}).gpus.empty());
}

}  // namespace
}  // namespace tandem::placement
