#include "engine/core/machine_checks.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>

#include "engine/core/platform/environment.h"
#include "engine/core/platform/locale_support.h"
#include "engine/core/units.h"

namespace tandem {

namespace {

// A node with less than this share of its RAM available pages the packed experts out, or the
// run does not fit on it at all.
constexpr double kNodeLowAvailableShare = 0.10;

MachineCheck makeCheck(std::string id, std::string title) {
  MachineCheck check;
  check.id = std::move(id);
  check.title = std::move(title);
  return check;
}

void setStatus(MachineCheck& check, CheckStatus status, std::string finding, std::string fix = {}) {
  check.status = status;
  check.finding = std::move(finding);
  check.fix = std::move(fix);
}

std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The number after `key` on its /proc/meminfo line, 0 when the key is absent.
uint64_t meminfoValue(std::string_view meminfo_text, std::string_view key) {
  std::istringstream in{std::string(meminfo_text)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0 || line.size() <= key.size() || line[key.size()] != ':') continue;
    return std::strtoull(line.c_str() + key.size() + 1, nullptr, 10);
  }
  return 0;
}

}  // namespace

std::string_view checkStatusName(CheckStatus status) {
  switch (status) {
    case CheckStatus::Ok: return "ok";
    case CheckStatus::Warn: return "warn";
    case CheckStatus::Fail: return "fail";
  }
  return "fail";
}

CheckStatus MachineReport::worst() const {
  CheckStatus worst = CheckStatus::Ok;
  for (const MachineCheck& check : checks) worst = std::max(worst, check.status);
  return worst;
}

int MachineReport::count(CheckStatus status) const {
  return static_cast<int>(
      std::count_if(checks.begin(), checks.end(),
                    [status](const MachineCheck& c) { return c.status == status; }));
}

MachineCheck checkCpu(const CpuFeatures& cpu) {
  MachineCheck check = makeCheck("cpu", "CPU features");
  const std::string level(isaLevelName(cpu.bestLevel()));
  check.figures["logical_cpus"] = static_cast<uint64_t>(cpu.logical_cpus);
  const std::string found = cpu.brand + ", " + std::to_string(cpu.logical_cpus) +
                            " logical CPUs; expert kernels: " + level;
  if (cpu.cap != IsaLevel::Amx) {
    setStatus(check, CheckStatus::Warn,
              found + " (capped by TANDEM_CPU_ISA=" + std::string(isaLevelName(cpu.cap)) + ")",
              "unset TANDEM_CPU_ISA to let the kernels use everything the CPU has");
  } else if (cpu.amx_tile && cpu.amx_bf16 && !cpu.amx_permitted) {
    // The CPU has AMX but this process may not use it: the expert kernels fall back to
    // AVX-512, several times slower.
    setStatus(check, CheckStatus::Warn, found + "; AMX present but not usable: " + cpu.amx_status,
              "run Linux 5.16 or newer with AMX enabled (XCR0), so that "
              "arch_prctl(ARCH_REQ_XCOMP_PERM) grants the tile data; check `uname -r`");
  } else if (!cpu.canUseAvx2()) {
    setStatus(check, CheckStatus::Warn, found + " (no AVX2: the portable kernels are slow)",
              "train on a CPU with AVX2 or better (AVX-512, AMX)");
  } else {
    setStatus(check, CheckStatus::Ok,
              found + (cpu.canUseAmxBf16() ? "; AMX usable" : "; no AMX on this CPU"));
  }
  return check;
}

MachineCheck checkNuma(bool numa_available, const std::vector<NodeMemory>& nodes) {
  MachineCheck check = makeCheck("numa", "NUMA nodes and RAM");
  std::string finding = numa_available ? std::to_string(nodes.size()) + " NUMA node(s)"
                                       : std::string("no NUMA support (one node assumed)");
  std::vector<int> low_nodes;
  for (const NodeMemory& node : nodes) {
    finding += "\nnode " + std::to_string(node.id) + ": " + std::to_string(node.cpus) + " CPUs, " +
               formatBytes(node.available_bytes) + " available of " + formatBytes(node.total_bytes);
    const std::string key = "node" + std::to_string(node.id);
    check.figures[key + "_total_bytes"] = node.total_bytes;
    check.figures[key + "_available_bytes"] = node.available_bytes;
    if (node.total_bytes > 0 &&
        static_cast<double>(node.available_bytes) <
            kNodeLowAvailableShare * static_cast<double>(node.total_bytes)) {
      low_nodes.push_back(node.id);
    }
  }
  if (nodes.empty()) {
    setStatus(check, CheckStatus::Fail, "no memory could be read",
              "check that /proc and /sys are mounted");
  } else if (!low_nodes.empty()) {
    std::string ids;
    for (int id : low_nodes) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    setStatus(check, CheckStatus::Warn, finding,
              "node(s) " + ids +
                  " have under 10% of their RAM available: stop other jobs "
                  "(`numastat -m` shows who holds it)");
  } else {
    setStatus(check, CheckStatus::Ok, finding);
  }
  return check;
}

std::string parseThpMode(std::string_view enabled_text) {
  const auto open = enabled_text.find('[');
  const auto close = enabled_text.find(']', open);
  if (open == std::string_view::npos || close == std::string_view::npos) return {};
  return std::string(enabled_text.substr(open + 1, close - open - 1));
}

HugePageFacts parseHugePageFacts(std::string_view thp_enabled_text, std::string_view meminfo_text) {
  HugePageFacts facts;
  facts.thp_mode = parseThpMode(thp_enabled_text);
  facts.pages_total = meminfoValue(meminfo_text, "HugePages_Total");
  facts.pages_free = meminfoValue(meminfo_text, "HugePages_Free");
  facts.page_bytes = meminfoValue(meminfo_text, "Hugepagesize") * 1024;  // the file says kB
  return facts;
}

MachineCheck checkHugePages(const HugePageFacts& facts) {
  MachineCheck check = makeCheck("huge_pages", "Huge pages");
  std::string finding = "transparent huge pages: " +
                        (facts.thp_mode.empty() ? std::string("not available") : facts.thp_mode);
  const uint64_t pool_bytes = facts.pages_total * facts.page_bytes;
  check.figures = {{"pages_total", facts.pages_total},
                   {"pages_free", facts.pages_free},
                   {"page_bytes", facts.page_bytes}};
  if (facts.pages_total > 0) {
    finding += "; hugetlbfs pool: " + std::to_string(facts.pages_total) + " pages (" +
               formatBytes(pool_bytes) + "), " + std::to_string(facts.pages_free) + " free";
  }
  // Tandem allocates with malloc/mmap, never from hugetlbfs: a pool is RAM the run cannot have.
  const bool pool_idle = facts.pages_total > 0 && facts.pages_free == facts.pages_total;
  if (facts.thp_mode == "never" || facts.thp_mode.empty()) {
    // The packed experts are hundreds of GB read in a stream: 4 KiB pages cost TLB misses.
    setStatus(check, CheckStatus::Warn, finding,
              "echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled");
  } else if (pool_idle) {
    setStatus(check, CheckStatus::Warn,
              finding + "; the pool is unused and Tandem cannot allocate from it",
              "sudo sysctl vm.nr_hugepages=0 (unless another program needs the pool)");
  } else {
    setStatus(check, CheckStatus::Ok, finding);
  }
  return check;
}

std::string parseNvidiaDriverVersion(std::string_view proc_version_text) {
  const auto line_end = proc_version_text.find('\n');
  const std::string_view line = proc_version_text.substr(0, line_end);
  const auto module = line.find("Kernel Module");
  std::istringstream words{std::string(
      module == std::string_view::npos ? line : line.substr(module + sizeof("Kernel Module")))};
  std::string word;
  while (words >> word) {
    // The version is the first word made of digits and dots: "550.54.14".
    if (std::isdigit(static_cast<unsigned char>(word[0])) &&
        word.find_first_not_of("0123456789.") == std::string::npos) {
      return word;
    }
  }
  return {};
}

MachineCheck checkGpu(const GpuFacts& facts) {
  MachineCheck check = makeCheck("gpu", "GPU driver and CUDA");
  const std::string driver =
      facts.driver_version.empty() ? std::string() : "NVIDIA driver " + facts.driver_version;
  const std::string runtime = !facts.cuda_runtime_version.empty()
                                  ? "CUDA runtime " + facts.cuda_runtime_version
                              : facts.torch_has_cuda ? std::string("libtorch with CUDA")
                                                     : std::string("libtorch without CUDA");
  check.figures["gpu_count"] = facts.gpus.size();
  if (!facts.gpus.empty()) {
    std::string finding = driver.empty() ? runtime : driver + ", " + runtime;
    for (const std::string& gpu : facts.gpus) finding += "\n" + gpu;
    setStatus(check, CheckStatus::Ok, finding);
  } else if (facts.driver_version.empty()) {
    setStatus(check, CheckStatus::Warn,
              "no NVIDIA driver: training runs on the CPU (" + runtime + ")",
              "if this machine has an NVIDIA GPU, install its driver (`nvidia-smi` must list "
              "it); otherwise nothing to do");
  } else if (!facts.torch_has_cuda) {
    setStatus(check, CheckStatus::Warn, driver + ", but " + runtime + ": training runs on the CPU",
              "install a CUDA build of torch in the project venv (scripts/setup.sh) and rebuild");
  } else if (!facts.built_with_cuda) {
    setStatus(check, CheckStatus::Warn,
              driver + ", " + runtime + ", but Tandem was built without CUDA",
              "rebuild with the CUDA toolkit (nvcc) installed, so TANDEM_WITH_CUDA is on");
  } else {
    setStatus(check, CheckStatus::Warn,
              driver + ", " + runtime + ", but no GPU is usable: " + facts.gpu_status,
              "run `nvidia-smi`; check CUDA_VISIBLE_DEVICES and that the driver supports "
              "CUDA " +
                  facts.cuda_runtime_version);
  }
  return check;
}

MachineCheck checkDisk(const std::filesystem::path& dir, uint64_t capacity_bytes,
                       uint64_t available_bytes) {
  MachineCheck check = makeCheck("disk", "Free disk in the output directory");
  check.figures = {{"capacity_bytes", capacity_bytes}, {"available_bytes", available_bytes}};
  const std::string finding = formatBytes(available_bytes) + " free of " +
                              formatBytes(capacity_bytes) + " at " + dir.string();
  const std::string fix =
      "free space there, or give a directory on a larger disk "
      "(--output-dir, output_dir: in the training YAML)";
  if (available_bytes < kDiskFailBytes) {
    setStatus(check, CheckStatus::Fail, finding, fix);
  } else if (available_bytes < kDiskWarnBytes) {
    setStatus(check, CheckStatus::Warn, finding + " (checkpoints of a long run need more)", fix);
  } else {
    setStatus(check, CheckStatus::Ok, finding);
  }
  return check;
}

MachineCheck checkLocale(const LocaleFacts& facts) {
  MachineCheck check = makeCheck("locale", "Locale (LC_CTYPE)");
  const std::string name = facts.name.empty() ? std::string("C") : facts.name;
  const std::string finding = "LC_CTYPE " + name +
                              (facts.variable.empty() ? " (no LC_ALL, LC_CTYPE or LANG set)"
                                                      : " (from " + facts.variable + ")");
  const std::string fix = "export LANG=C.UTF-8 (or another UTF-8 locale from `locale -a`)";
  const std::string lowered = lower(name);
  const bool utf8 =
      lowered.find("utf-8") != std::string::npos || lowered.find("utf8") != std::string::npos;
  if (name == "C" || name == "POSIX") {
    setStatus(check, CheckStatus::Warn, finding + ": ASCII only", fix);
  } else if (!utf8) {
    setStatus(check, CheckStatus::Warn, finding + ": not UTF-8", fix);
  } else if (!facts.installed) {
    setStatus(check, CheckStatus::Warn, finding + ": not installed on this system",
              "sudo locale-gen " + name + ", or " + fix);
  } else {
    setStatus(check, CheckStatus::Ok, finding);
  }
  return check;
}

HugePageFacts readHugePageFacts() {
  return parseHugePageFacts(readFile("/sys/kernel/mm/transparent_hugepage/enabled"),
                            readFile("/proc/meminfo"));
}

std::string readNvidiaDriverVersion() {
  return parseNvidiaDriverVersion(readFile("/proc/driver/nvidia/version"));
}

LocaleFacts readLocaleFacts() {
  LocaleFacts facts;
  for (const char* variable : {"LC_ALL", "LC_CTYPE", "LANG"}) {
    facts.name = platform::environmentVariable(variable);
    if (!facts.name.empty()) {
      facts.variable = variable;
      break;
    }
  }
  if (!facts.name.empty()) facts.installed = platform::localeIsInstalled(facts.name);
  return facts;
}

MachineCheck checkDiskAt(const std::filesystem::path& dir) {
  // The output directory is often made by the run itself: measure the disk it will be on.
  std::error_code error;
  std::filesystem::path existing = std::filesystem::absolute(dir, error);
  while (!existing.empty() && !std::filesystem::exists(existing, error) &&
         existing != existing.parent_path()) {
    existing = existing.parent_path();
  }
  const std::filesystem::space_info space = std::filesystem::space(existing, error);
  if (error) {
    MachineCheck check = makeCheck("disk", "Free disk in the output directory");
    setStatus(check, CheckStatus::Fail,
              "cannot read the free space at " + dir.string() + ": " + error.message(),
              "give an output directory that exists or can be created (--output-dir)");
    return check;
  }
  return checkDisk(dir, space.capacity, space.available);
}

std::string formatMachineReport(const MachineReport& report) {
  size_t title_width = 5;
  for (const MachineCheck& check : report.checks)
    title_width = std::max(title_width, check.title.size());
  const std::string indent(8 + title_width + 2, ' ');
  std::string out = "status" + std::string(2, ' ') + "check" +
                    std::string(title_width - 5 + 2, ' ') + "finding\n";
  for (const MachineCheck& check : report.checks) {
    std::string status(checkStatusName(check.status));
    out += status + std::string(8 - status.size(), ' ') + check.title +
           std::string(title_width - check.title.size() + 2, ' ');
    // Later lines of a finding line up under its first.
    std::istringstream lines(check.finding);
    std::string line;
    bool first = true;
    while (std::getline(lines, line)) {
      out += (first ? "" : indent) + line + "\n";
      first = false;
    }
    if (first) out += "\n";
    if (!check.fix.empty()) out += indent + "fix: " + check.fix + "\n";
  }
  out += "\n" + std::to_string(report.count(CheckStatus::Fail)) + " failed, " +
         std::to_string(report.count(CheckStatus::Warn)) + " warning(s), " +
         std::to_string(report.count(CheckStatus::Ok)) + " ok\n";
  return out;
}

}  // namespace tandem
