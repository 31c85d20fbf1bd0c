#include "engine/core/machine_checks.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/core/platform/environment.h"

namespace tandem {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

// A /proc/meminfo as Linux 6.1 writes it, trimmed to the lines around the ones read.
constexpr const char* kMeminfoWithPool =
    "MemTotal:       263843364 kB\n"
    "MemFree:        190000000 kB\n"
    "HugePages_Total:     512\n"
    "HugePages_Free:      512\n"
    "HugePages_Rsvd:        0\n"
    "HugePages_Surp:        0\n"
    "Hugepagesize:       2048 kB\n"
    "Hugetlb:         1048576 kB\n";

constexpr const char* kMeminfoNoPool =
    "MemTotal:       263843364 kB\n"
    "HugePages_Total:       0\n"
    "HugePages_Free:        0\n"
    "Hugepagesize:       2048 kB\n";

CpuFeatures amxCpu() {
  CpuFeatures cpu;
  cpu.brand = "Intel Xeon w9-3495X";
  cpu.logical_cpus = 112;
  cpu.avx2 = cpu.fma = cpu.f16c = true;
  cpu.avx512f = cpu.avx512bw = cpu.avx512vl = cpu.avx512dq = true;
  cpu.avx512_bf16 = cpu.avx512_vnni = true;
  cpu.amx_tile = cpu.amx_bf16 = cpu.amx_int8 = true;
  cpu.os_avx = cpu.os_avx512 = cpu.os_amx = true;
  cpu.amx_permitted = true;
  cpu.amx_status = "usable";
  return cpu;
}

TEST(MachineChecks, ThpModeIsTheBracketedWord) {
  EXPECT_EQ(parseThpMode("always [madvise] never\n"), "madvise");
  EXPECT_EQ(parseThpMode("[always] madvise never\n"), "always");
  EXPECT_EQ(parseThpMode("always madvise [never]\n"), "never");
  EXPECT_EQ(parseThpMode(""), "");
}

TEST(MachineChecks, HugePageFactsFromMeminfo) {
  const HugePageFacts facts = parseHugePageFacts("always [madvise] never\n", kMeminfoWithPool);
  EXPECT_EQ(facts.thp_mode, "madvise");
  EXPECT_EQ(facts.pages_total, 512u);
  EXPECT_EQ(facts.pages_free, 512u);
  EXPECT_EQ(facts.page_bytes, 2048u * 1024);
}

TEST(MachineChecks, HugePagesOkWithThpAndNoPool) {
  const MachineCheck check =
      checkHugePages(parseHugePageFacts("[always] madvise never", kMeminfoNoPool));
  EXPECT_EQ(check.status, CheckStatus::Ok) << check.finding;
  EXPECT_NE(check.finding.find("always"), std::string::npos);
  EXPECT_TRUE(check.fix.empty());
}

TEST(MachineChecks, HugePagesWarnWhenThpIsOff) {
  const MachineCheck check =
      checkHugePages(parseHugePageFacts("always madvise [never]", kMeminfoNoPool));
  EXPECT_EQ(check.status, CheckStatus::Warn);
  EXPECT_NE(check.fix.find("transparent_hugepage/enabled"), std::string::npos);
  // A kernel without THP (no file) is warned about the same way.
  EXPECT_EQ(checkHugePages(parseHugePageFacts("", kMeminfoNoPool)).status, CheckStatus::Warn);
}

TEST(MachineChecks, HugePagesWarnOfAnIdleHugetlbPool) {
  const MachineCheck check =
      checkHugePages(parseHugePageFacts("always [madvise] never", kMeminfoWithPool));
  EXPECT_EQ(check.status, CheckStatus::Warn);
  EXPECT_NE(check.finding.find("1.00 GiB"), std::string::npos) << check.finding;
  EXPECT_NE(check.fix.find("vm.nr_hugepages=0"), std::string::npos);
}

TEST(MachineChecks, DiskFailsWhenNearlyFull) {
  // A 2 TB disk with 1 GiB left: not one checkpoint fits.
  const MachineCheck check = checkDisk("/data/runs", 2000ull * 1000 * 1000 * 1000, 1 * kGiB);
  EXPECT_EQ(check.status, CheckStatus::Fail);
  EXPECT_NE(check.finding.find("1.00 GiB free"), std::string::npos) << check.finding;
  EXPECT_NE(check.finding.find("/data/runs"), std::string::npos);
  EXPECT_NE(check.fix.find("--output-dir"), std::string::npos);
  EXPECT_EQ(check.figures.at("available_bytes"), 1 * kGiB);
  EXPECT_EQ(check.figures.at("capacity_bytes"), 2000ull * 1000 * 1000 * 1000);
}

TEST(MachineChecks, DiskThresholds) {
  EXPECT_EQ(checkDisk("/d", 100 * kGiB, kDiskFailBytes - 1).status, CheckStatus::Fail);
  EXPECT_EQ(checkDisk("/d", 100 * kGiB, kDiskFailBytes).status, CheckStatus::Warn);
  EXPECT_EQ(checkDisk("/d", 100 * kGiB, kDiskWarnBytes - 1).status, CheckStatus::Warn);
  const MachineCheck ok = checkDisk("/d", 100 * kGiB, kDiskWarnBytes);
  EXPECT_EQ(ok.status, CheckStatus::Ok);
  EXPECT_TRUE(ok.fix.empty());
}

TEST(MachineChecks, DiskAtAMissingDirectoryMeasuresItsParent) {
  const std::filesystem::path missing =
      std::filesystem::temp_directory_path() / "tandem-doctor-no-such-dir" / "deeper";
  const MachineCheck check = checkDiskAt(missing);
  EXPECT_NE(check.status, CheckStatus::Fail) << check.finding;
  EXPECT_NE(check.finding.find("free of"), std::string::npos) << check.finding;
}

TEST(MachineChecks, LocaleWarnsForCAndPosix) {
  for (const char* name : {"C", "POSIX", ""}) {
    const MachineCheck check = checkLocale({name[0] ? "LANG" : "", name, true});
    EXPECT_EQ(check.status, CheckStatus::Warn) << name;
    EXPECT_NE(check.fix.find("UTF-8"), std::string::npos) << name;
  }
}

TEST(MachineChecks, LocaleOkForUtf8) {
  EXPECT_EQ(checkLocale({"LANG", "C.UTF-8", true}).status, CheckStatus::Ok);
  EXPECT_EQ(checkLocale({"LC_ALL", "de_DE.utf8", true}).status, CheckStatus::Ok);
  EXPECT_EQ(checkLocale({"LANG", "en_US.ISO-8859-1", true}).status, CheckStatus::Warn);
  const MachineCheck missing = checkLocale({"LANG", "xx_YY.UTF-8", false});
  EXPECT_EQ(missing.status, CheckStatus::Warn);
  EXPECT_NE(missing.fix.find("locale-gen xx_YY.UTF-8"), std::string::npos);
}

TEST(MachineChecks, LocaleFollowsPosixPrecedence) {
  platform::setEnvironmentVariable("LC_ALL", "C");
  platform::setEnvironmentVariable("LANG", "C.UTF-8");
  EXPECT_EQ(readLocaleFacts().variable, "LC_ALL");
  EXPECT_EQ(checkLocale(readLocaleFacts()).status, CheckStatus::Warn);
  platform::unsetEnvironmentVariable("LC_ALL");
  platform::unsetEnvironmentVariable("LC_CTYPE");
  EXPECT_EQ(readLocaleFacts().variable, "LANG");
  EXPECT_EQ(readLocaleFacts().name, "C.UTF-8");
}

TEST(MachineChecks, NvidiaDriverVersion) {
  EXPECT_EQ(parseNvidiaDriverVersion("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  "
                                     "Thu Feb 22 01:44:30 UTC 2024\nGCC version:  gcc 12\n"),
            "550.54.14");
  EXPECT_EQ(parseNvidiaDriverVersion("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                                     "580.65.06  Release Build\n"),
            "580.65.06");
  EXPECT_EQ(parseNvidiaDriverVersion(""), "");
}

TEST(MachineChecks, NoDriverIsAClearWarningNotAFailure) {
  GpuFacts facts;
  facts.cuda_runtime_version = "13.0";
  facts.torch_has_cuda = true;
  facts.gpu_status = "no NVIDIA driver";
  const MachineCheck check = checkGpu(facts);
  EXPECT_EQ(check.status, CheckStatus::Warn);
  EXPECT_NE(check.finding.find("no NVIDIA driver: training runs on the CPU"), std::string::npos);
  EXPECT_FALSE(check.fix.empty());
}

TEST(MachineChecks, NoDriverNamesWhatTorchHas) {
  GpuFacts cuda_torch;
  cuda_torch.torch_has_cuda = true;
  EXPECT_NE(checkGpu(cuda_torch).finding.find("libtorch with CUDA"), std::string::npos);
  EXPECT_NE(checkGpu(GpuFacts{}).finding.find("libtorch without CUDA"), std::string::npos);
  EXPECT_EQ(checkGpu(GpuFacts{}).figures.at("gpu_count"), 0u);
}

TEST(MachineChecks, GpuOkListsTheGpus) {
  GpuFacts facts;
  facts.driver_version = "580.65.06";
  facts.cuda_runtime_version = "13.0";
  facts.torch_has_cuda = facts.built_with_cuda = true;
  facts.gpus = {"cuda:0 NVIDIA H200, 139.8 GiB"};
  const MachineCheck check = checkGpu(facts);
  EXPECT_EQ(check.status, CheckStatus::Ok);
  EXPECT_NE(check.finding.find("580.65.06"), std::string::npos);
  EXPECT_NE(check.finding.find("CUDA runtime 13.0"), std::string::npos);
  EXPECT_NE(check.finding.find("NVIDIA H200"), std::string::npos);
}

TEST(MachineChecks, DriverWithCpuOnlyTorchSaysWhatToInstall) {
  GpuFacts facts;
  facts.driver_version = "550.54.14";
  const MachineCheck check = checkGpu(facts);
  EXPECT_EQ(check.status, CheckStatus::Warn);
  EXPECT_NE(check.finding.find("without CUDA"), std::string::npos) << check.finding;
  EXPECT_NE(check.fix.find("CUDA build of torch"), std::string::npos);
}

TEST(MachineChecks, CpuWithAmxIsOk) {
  const MachineCheck check = checkCpu(amxCpu());
  EXPECT_EQ(check.status, CheckStatus::Ok) << check.finding;
  EXPECT_NE(check.finding.find("amx"), std::string::npos) << check.finding;
}

TEST(MachineChecks, CpuWithAmxRefusedByTheKernelWarns) {
  CpuFeatures cpu = amxCpu();
  cpu.amx_permitted = false;
  cpu.amx_status = "the kernel refused the AMX permission";
  const MachineCheck check = checkCpu(cpu);
  EXPECT_EQ(check.status, CheckStatus::Warn);
  EXPECT_NE(check.finding.find("refused"), std::string::npos);
  EXPECT_NE(check.fix.find("ARCH_REQ_XCOMP_PERM"), std::string::npos);
  EXPECT_NE(check.finding.find("avx512_bf16"), std::string::npos) << check.finding;
}

TEST(MachineChecks, CpuCappedByTheEnvironmentWarns) {
  CpuFeatures cpu = amxCpu();
  cpu.cap = IsaLevel::Avx2;
  const MachineCheck check = checkCpu(cpu);
  EXPECT_EQ(check.status, CheckStatus::Warn);
  EXPECT_NE(check.fix.find("unset TANDEM_CPU_ISA"), std::string::npos);
}

TEST(MachineChecks, NumaWarnsForANodeNearlyFull) {
  const std::vector<NodeMemory> nodes = {{0, 56, 256 * kGiB, 200 * kGiB},
                                         {1, 56, 256 * kGiB, 10 * kGiB}};
  const MachineCheck check = checkNuma(true, nodes);
  EXPECT_EQ(check.status, CheckStatus::Warn);
  EXPECT_NE(check.finding.find("node 1: 56 CPUs, 10.0 GiB available of 256 GiB"), std::string::npos)
      << check.finding;
  EXPECT_NE(check.fix.find("node(s) 1 "), std::string::npos) << check.fix;
  EXPECT_EQ(check.figures.at("node1_available_bytes"), 10 * kGiB);
  EXPECT_EQ(checkNuma(true, {{0, 56, 256 * kGiB, 200 * kGiB}}).status, CheckStatus::Ok);
  EXPECT_EQ(checkNuma(false, {}).status, CheckStatus::Fail);
}

TEST(MachineChecks, ReportTableAndWorstStatus) {
  MachineReport report;
  report.checks.push_back(checkLocale({"LANG", "C.UTF-8", true}));
  EXPECT_FALSE(report.anyFailed());
  report.checks.push_back(checkDisk("/full", 100 * kGiB, 0));
  report.checks.push_back(checkLocale({"LANG", "C", true}));
  EXPECT_EQ(report.worst(), CheckStatus::Fail);
  EXPECT_TRUE(report.anyFailed());
  const std::string table = formatMachineReport(report);
  EXPECT_NE(table.find("fail    Free disk in the output directory"), std::string::npos) << table;
  EXPECT_NE(table.find("fix: export LANG=C.UTF-8"), std::string::npos) << table;
  EXPECT_NE(table.find("1 failed, 1 warning(s), 1 ok"), std::string::npos) << table;
}

}  // namespace
}  // namespace tandem
