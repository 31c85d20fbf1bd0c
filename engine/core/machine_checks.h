#pragma once
// The checks of `tandem doctor` (and the studio's Help > Machine check): is this machine ready
// for a long run, and if not, what to change. Each check is a pure function of the facts it is
// given (file texts, numbers, environment values), so tests state every case; the read* helpers
// below take those facts from this machine. engine/model/machine_doctor.h runs them all, with
// the GPU facts libtorch gives.
//
// A check is ok, warn (the run works but slower or at risk) or fail (the run should not start),
// says what it found, and when not ok what to do: a command or a setting.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/cpu_features.h"

namespace tandem {

enum class CheckStatus { Ok = 0, Warn = 1, Fail = 2 };

std::string_view checkStatusName(CheckStatus status);  // "ok", "warn", "fail"

struct MachineCheck {
  std::string id;     // stable key for machines: "cpu", "numa", "huge_pages", ...
  std::string title;  // for people: "CPU features"
  CheckStatus status = CheckStatus::Ok;
  std::string finding;  // what was found, one or a few lines
  std::string fix;      // what to do; empty when ok
  // The numbers behind the finding, for machines (`tandem doctor --json`): "available_bytes",
  // "node0_total_bytes", "gpu_count", ...
  std::map<std::string, uint64_t> figures;
};

struct MachineReport {
  std::vector<MachineCheck> checks;

  CheckStatus worst() const;
  bool anyFailed() const { return worst() == CheckStatus::Fail; }
  int count(CheckStatus status) const;
};

// CPU: the best ISA the expert kernels may use, AMX permission (arch_prctl) and the
// TANDEM_CPU_ISA cap.
MachineCheck checkCpu(const CpuFeatures& cpu);

// NUMA: each node's RAM a run can have now (free + reclaimable page cache).
struct NodeMemory {
  int id = 0;
  int cpus = 0;
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;
};
MachineCheck checkNuma(bool numa_available, const std::vector<NodeMemory>& nodes);

// Huge pages: the transparent huge page mode (text of /sys/kernel/mm/transparent_hugepage/enabled,
// "always [madvise] never"; empty when the file is missing) and the hugetlbfs pool of
// /proc/meminfo (HugePages_Total/Free, Hugepagesize), which ordinary allocations cannot use.
struct HugePageFacts {
  std::string thp_mode;  // the bracketed word: "always", "madvise", "never"; empty: no THP
  uint64_t pages_total = 0;
  uint64_t pages_free = 0;
  uint64_t page_bytes = 0;  // Hugepagesize
};
std::string parseThpMode(std::string_view enabled_text);
HugePageFacts parseHugePageFacts(std::string_view thp_enabled_text, std::string_view meminfo_text);
MachineCheck checkHugePages(const HugePageFacts& facts);

// GPU: the NVIDIA driver, the CUDA runtime of the linked libtorch and the GPUs it sees.
struct GpuFacts {
  std::string driver_version;        // from /proc/driver/nvidia/version; empty: no driver loaded
  std::string cuda_runtime_version;  // libtorch's; empty for a CPU-only libtorch
  bool torch_has_cuda = false;
  bool built_with_cuda = false;   // Tandem's CUDA parts are compiled in
  std::vector<std::string> gpus;  // one line each: "cuda:0 NVIDIA H100, 79.1 GiB"
  std::string gpu_status;         // why no GPU is listed, when none is
};
// "550.54.14" from "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 ...";
// empty when the text names no version.
std::string parseNvidiaDriverVersion(std::string_view proc_version_text);
MachineCheck checkGpu(const GpuFacts& facts);

// Disk: the space left where the run writes (checkpoints and adapters). `dir` is what the user
// named; the numbers are of the file system holding it (its nearest existing parent).
constexpr uint64_t kDiskFailBytes = 2ull << 30;   // not even one checkpoint of a large LoRA
constexpr uint64_t kDiskWarnBytes = 20ull << 30;  // a long run's checkpoints fill this quickly
MachineCheck checkDisk(const std::filesystem::path& dir, uint64_t capacity_bytes,
                       uint64_t available_bytes);

// Locale: LC_CTYPE as the environment sets it (LC_ALL, else LC_CTYPE, else LANG, POSIX order).
// C/POSIX means ASCII: dataset text and file names outside it are misread by tools around the run.
struct LocaleFacts {
  std::string variable;   // which variable set it: "LC_ALL", "LC_CTYPE", "LANG"; empty: none
  std::string name;       // its value; empty: none set (the C locale)
  bool installed = true;  // newlocale() accepts it
};
MachineCheck checkLocale(const LocaleFacts& facts);

// This machine's facts.
HugePageFacts readHugePageFacts();
std::string readNvidiaDriverVersion();
LocaleFacts readLocaleFacts();
// Space of the file system holding `dir` (or its nearest existing parent); a check that fails
// with the reason when none can be read.
MachineCheck checkDiskAt(const std::filesystem::path& dir);

// The report as a table for people: status, check, finding, and an indented "fix:" line.
std::string formatMachineReport(const MachineReport& report);

}  // namespace tandem
