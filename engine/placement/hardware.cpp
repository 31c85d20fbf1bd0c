#include "engine/placement/hardware.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <utility>

#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/numa.h"
#include "engine/core/platform/cpu_topology.h"
#include "engine/core/platform/system_memory.h"
#include "engine/placement/yaml_file.h"

namespace tandem::placement {

namespace {

namespace fs = std::filesystem;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// --- preset parsing -------------------------------------------------------------------------

class PresetReader {
 public:
  explicit PresetReader(std::string label) : label_(std::move(label)) {}

  [[noreturn]] void fail(
      const std::string& key, const std::string& what,
      const std::string& todo = "see docs/placement.md for the preset schema") const {
    throw Error(label_ + ": " + key + ": " + what, todo);
  }

  void onlyKeys(const YAML::Node& node, const std::string& where,
                std::initializer_list<const char*> keys) const {
    yaml::onlyKeys(node, label_ + ": " + (where.empty() ? "(top level)" : where), keys);
  }

  YAML::Node required(const YAML::Node& node, const std::string& where, const char* key) const {
    const YAML::Node value = node[key];
    if (!value) fail(where.empty() ? key : where + "." + key, "is missing");
    return value;
  }

  std::string text(const YAML::Node& node, const std::string& key) const {
    if (!node.IsScalar()) fail(key, "must be a text value");
    return node.as<std::string>();
  }

  double positive(const YAML::Node& node, const std::string& key) const {
    double value = 0;
    if (!node.IsScalar() || !YAML::convert<double>::decode(node, value))
      fail(key, "must be a number");
    if (!(value > 0) || !std::isfinite(value))
      fail(key, "must be above 0, is " + node.as<std::string>());
    return value;
  }

  int positiveInt(const YAML::Node& node, const std::string& key) const {
    const double value = positive(node, key);
    if (value != std::floor(value) || value > 1e6)
      fail(key, "must be a whole number, is " + node.as<std::string>());
    return static_cast<int>(value);
  }

 private:
  std::string label_;
};

void readGpus(const PresetReader& r, const YAML::Node& list, Hardware& hw) {
  if (!list.IsSequence()) r.fail("gpus", "must be a list (`- model: ...` items), or [] for none");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "gpus[" + std::to_string(i) + "]";
    const YAML::Node g = list[i];
    r.onlyKeys(g, where, {"model", "memory_gib", "count", "pcie_gen", "pcie_lanes"});
    GpuSpec spec;
    spec.name = r.text(r.required(g, where, "model"), where + ".model");
    spec.total_bytes = static_cast<uint64_t>(
        r.positive(r.required(g, where, "memory_gib"), where + ".memory_gib") * kGiB);
    spec.free_bytes = spec.total_bytes;
    const int count = g["count"] ? r.positiveInt(g["count"], where + ".count") : 1;
    if (g["pcie_gen"]) {
      spec.pcie_gen = r.positiveInt(g["pcie_gen"], where + ".pcie_gen");
      if (spec.pcie_gen > 6) r.fail(where + ".pcie_gen", "must be 1 to 6");
    }
    if (g["pcie_lanes"]) {
      spec.pcie_lanes = r.positiveInt(g["pcie_lanes"], where + ".pcie_lanes");
      if (spec.pcie_lanes > 16) r.fail(where + ".pcie_lanes", "must be 1 to 16");
    }
    for (int c = 0; c < count; ++c) {
      spec.index = static_cast<int>(hw.gpus.size());
      hw.gpus.push_back(spec);
    }
  }
}

void readIsa(const PresetReader& r, const YAML::Node& list, CpuSpec& cpu) {
  if (!list.IsSequence()) r.fail("cpu.isa", "must be a list, e.g. [avx2, avx512, avx512_bf16]");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string name = r.text(list[i], "cpu.isa[" + std::to_string(i) + "]");
    if (name == "avx2")
      cpu.avx2 = true;
    else if (name == "avx512")
      cpu.avx512 = true;
    else if (name == "avx512_bf16")
      cpu.avx512_bf16 = true;
    else if (name == "amx_bf16")
      cpu.amx_bf16 = true;
    else if (name == "amx_int8")
      cpu.amx_int8 = true;
    else
      r.fail("cpu.isa[" + std::to_string(i) + "]", "unknown instruction set '" + name + "'",
             "use avx2, avx512, avx512_bf16, amx_bf16 or amx_int8");
  }
  if ((cpu.amx_bf16 || cpu.amx_int8 || cpu.avx512_bf16) && !cpu.avx512) {
    r.fail("cpu.isa", "lists AMX or AVX-512 BF16 without avx512",
           "every AMX and AVX-512 BF16 CPU has avx512: add it");
  }
}

void readCpuAndMemory(const PresetReader& r, const YAML::Node& root, Hardware& hw) {
  const YAML::Node cpu = r.required(root, "", "cpu");
  r.onlyKeys(cpu, "cpu", {"model", "vendor", "sockets", "cores_per_socket", "isa"});
  hw.cpu.name = r.text(r.required(cpu, "cpu", "model"), "cpu.model");
  hw.cpu.vendor = r.text(r.required(cpu, "cpu", "vendor"), "cpu.vendor");
  if (hw.cpu.vendor != "intel" && hw.cpu.vendor != "amd" && hw.cpu.vendor != "other") {
    r.fail("cpu.vendor", "must be intel, amd or other, is '" + hw.cpu.vendor + "'");
  }
  hw.cpu.sockets = r.positiveInt(r.required(cpu, "cpu", "sockets"), "cpu.sockets");
  const int per_socket =
      r.positiveInt(r.required(cpu, "cpu", "cores_per_socket"), "cpu.cores_per_socket");
  hw.cpu.physical_cores = hw.cpu.sockets * per_socket;
  readIsa(r, r.required(cpu, "cpu", "isa"), hw.cpu);

  const YAML::Node memory = r.required(root, "", "memory");
  r.onlyKeys(memory, "memory", {"total_gib", "numa_nodes"});
  const double total_gib =
      r.positive(r.required(memory, "memory", "total_gib"), "memory.total_gib");
  const int nodes = memory["numa_nodes"] ? r.positiveInt(memory["numa_nodes"], "memory.numa_nodes")
                                         : hw.cpu.sockets;
  if (nodes > hw.cpu.physical_cores)
    r.fail("memory.numa_nodes", "is more than the number of cores");
  // RAM and cores split evenly over the nodes (as BIOSes interleave DIMMs per socket / SNC domain).
  for (int n = 0; n < nodes; ++n) {
    NumaNodeSpec node;
    node.id = n;
    node.cores = hw.cpu.physical_cores / nodes + (n < hw.cpu.physical_cores % nodes ? 1 : 0);
    node.total_bytes = static_cast<uint64_t>(total_gib * kGiB / nodes);
    node.free_bytes = node.total_bytes;
    hw.numa_nodes.push_back(node);
  }
}

}  // namespace

uint64_t Hardware::ramBytes() const {
  uint64_t total = 0;
  for (const NumaNodeSpec& n : numa_nodes) total += n.total_bytes;
  return total;
}

Hardware probeHardware(std::vector<GpuSpec> gpus) {
  Hardware hw;
  hw.name = "this machine";
  hw.source = "probe";
  hw.gpus = std::move(gpus);
  const CpuFeatures& f = cpuFeatures();
  hw.cpu.name = f.brand;
  hw.cpu.vendor = f.vendor == "GenuineIntel"   ? "intel"
                  : f.vendor == "AuthenticAMD" ? "amd"
                                               : "other";
  hw.cpu.avx2 = f.canUseAvx2();
  hw.cpu.avx512 = f.canUseAvx512();
  hw.cpu.avx512_bf16 = f.canUseAvx512Bf16();
  hw.cpu.amx_bf16 = f.canUseAmxBf16();
  hw.cpu.amx_int8 = f.canUseAmxInt8();
  const NumaTopology numa = detectNumaTopology();
  std::vector<int> cpu_ids;
  for (const NumaNode& node : numa.nodes)
    cpu_ids.insert(cpu_ids.end(), node.cpus.begin(), node.cpus.end());
  const platform::CpuCoreCounts cores = platform::cpuCoreCounts(cpu_ids);
  hw.cpu.sockets = cores.sockets;
  hw.cpu.physical_cores = cores.physical_cores;
  // What a run can have is the available memory: free plus reclaimable, shared out by node size.
  const uint64_t reclaimable = platform::systemMemoryBytes().reclaimable_bytes;
  const double total = static_cast<double>(numa.totalBytes());
  for (const NumaNode& node : numa.nodes) {
    const auto share = static_cast<uint64_t>(static_cast<double>(reclaimable) *
                                             static_cast<double>(node.total_bytes) / total);
    hw.numa_nodes.push_back({node.id, static_cast<int>(node.cpus.size()), node.total_bytes,
                             std::min(node.total_bytes, node.free_bytes + share)});
  }
  return hw;
}

Hardware parseHardwarePreset(std::string_view yaml_text, const std::string& label) {
  const PresetReader r(label);
  const YAML::Node root = yaml::parse(yaml_text, label);
  if (!root.IsMap())
    r.fail("(top level)", "must be a block of `key: value` lines (name, gpus, cpu, memory)");
  r.onlyKeys(root, "", {"name", "gpus", "cpu", "memory"});
  Hardware hw;
  hw.source = label;
  hw.name = r.text(r.required(root, "", "name"), "name");
  readGpus(r, r.required(root, "", "gpus"), hw);
  readCpuAndMemory(r, root, hw);
  return hw;
}

Hardware loadHardwarePreset(const fs::path& file) {
  return parseHardwarePreset(yaml::readFile(file, "hardware preset", "check the path"),
                             file.string());
}

std::vector<fs::path> listHardwarePresets(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

Hardware resolveHardware(const std::string& spec, const fs::path& presets_dir) {
  if (spec.ends_with(".yaml") || spec.ends_with(".yml") || spec.find('/') != std::string::npos) {
    return loadHardwarePreset(spec);
  }
  std::string known;
  for (const fs::path& file : listHardwarePresets(presets_dir)) {
    if (file.stem() == spec) return loadHardwarePreset(file);
    known += (known.empty() ? "" : ", ") + file.stem().string();
  }
  throw Error("no hardware preset named '" + spec + "' in " + presets_dir.string(),
              known.empty() ? "give a preset file path" : "known presets: " + known);
}

std::string hardwareToYaml(const Hardware& hw) {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << hw.name;
  out << YAML::Key << "gpus" << YAML::Value << YAML::BeginSeq;
  for (const GpuSpec& g : hw.gpus) {
    out << YAML::BeginMap << YAML::Key << "model" << YAML::Value << g.name;
    out << YAML::Key << "memory_gib" << YAML::Value << static_cast<double>(g.total_bytes) / kGiB;
    if (g.pcie_gen > 0) out << YAML::Key << "pcie_gen" << YAML::Value << g.pcie_gen;
    if (g.pcie_lanes > 0) out << YAML::Key << "pcie_lanes" << YAML::Value << g.pcie_lanes;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "cpu" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "model" << YAML::Value << hw.cpu.name << YAML::Key << "vendor" << YAML::Value
      << hw.cpu.vendor;
  out << YAML::Key << "sockets" << YAML::Value << hw.cpu.sockets;
  out << YAML::Key << "cores_per_socket" << YAML::Value
      << std::max(1, hw.cpu.physical_cores / hw.cpu.sockets);
  out << YAML::Key << "isa" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  const std::pair<bool, const char*> isa[] = {{hw.cpu.avx2, "avx2"},
                                              {hw.cpu.avx512, "avx512"},
                                              {hw.cpu.avx512_bf16, "avx512_bf16"},
                                              {hw.cpu.amx_bf16, "amx_bf16"},
                                              {hw.cpu.amx_int8, "amx_int8"}};
  for (const auto& [has, name] : isa) {
    if (has) out << name;
  }
  out << YAML::EndSeq << YAML::EndMap;
  out << YAML::Key << "memory" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "total_gib" << YAML::Value << static_cast<double>(hw.ramBytes()) / kGiB;
  out << YAML::Key << "numa_nodes" << YAML::Value << static_cast<int>(hw.numa_nodes.size());
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace tandem::placement
