#include "engine/placement/placement.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <utility>

#include "engine/core/error.h"
#include "engine/placement/expert_format.h"
#include "engine/placement/hardware.h"
#include "engine/placement/yaml_file.h"

namespace tandem::placement {

namespace {

template <size_t N>
bool listed(const std::string_view (&list)[N], const std::string& value) {
  return std::find(std::begin(list), std::end(list), value) != std::end(list);
}

template <typename Names>
std::string joined(const Names& list) {
  std::string out;
  for (std::string_view s : list) out += (out.empty() ? "" : ", ") + std::string(s);
  return out;
}

}  // namespace

std::string_view moduleKindName(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::Embedding: return "embedding";
    case ModuleKind::Attention: return "attention";
    case ModuleKind::Router: return "router";
    case ModuleKind::SharedExperts: return "shared_experts";
    case ModuleKind::RoutedExperts: return "routed_experts";
    case ModuleKind::DenseMlp: return "dense_mlp";
    case ModuleKind::FinalNorm: return "final_norm";
    case ModuleKind::LmHead: return "lm_head";
  }
  return "?";
}

const ModulePlacement* Placement::find(std::string_view name) const {
  for (const ModulePlacement& m : modules) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

ModulePlacement* Placement::find(std::string_view name) {
  return const_cast<ModulePlacement*>(std::as_const(*this).find(name));
}

std::vector<Device> Placement::layerDevices() const {
  std::vector<Device> out;
  for (const ModulePlacement& m : modules) {
    if (m.kind != ModuleKind::Attention) continue;
    const auto layer = static_cast<size_t>(m.layer);
    if (out.size() <= layer) out.resize(layer + 1);
    out[layer] = m.device;
  }
  return out;
}

std::vector<Device> Placement::devices() const {
  std::set<Device> out;  // Device's order: GPUs by index, then cpu, then NUMA nodes by index
  for (const ModulePlacement& m : modules) {
    out.insert(m.device);
    if (m.compute_device) out.insert(*m.compute_device);
  }
  return {out.begin(), out.end()};
}

Placement modulesOf(const io::ModelConfig& model) {
  if (model.num_hidden_layers <= 0)
    throw Error("the model has no decoder layers (num_hidden_layers)");
  Placement p;
  p.modules.push_back({"model.embed_tokens", ModuleKind::Embedding, -1});
  const bool qwen2_shared =
      model.architecture == io::Architecture::Qwen2Moe && model.shared_expert_intermediate_size > 0;
  const bool deepseek_shared = (model.architecture == io::Architecture::DeepseekV2 ||
                                model.architecture == io::Architecture::DeepseekV3) &&
                               model.n_shared_experts > 0;
  for (int l = 0; l < model.num_hidden_layers; ++l) {
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    p.modules.push_back({prefix + "self_attn", ModuleKind::Attention, l});
    if (model.isMoeLayer(l)) {
      p.modules.push_back({prefix + "mlp.gate", ModuleKind::Router, l});
      if (qwen2_shared)
        p.modules.push_back({prefix + "mlp.shared_expert", ModuleKind::SharedExperts, l});
      if (deepseek_shared)
        p.modules.push_back({prefix + "mlp.shared_experts", ModuleKind::SharedExperts, l});
      p.modules.push_back({prefix + "mlp.experts", ModuleKind::RoutedExperts, l});
    } else {
      p.modules.push_back({prefix + "mlp", ModuleKind::DenseMlp, l});
    }
  }
  p.modules.push_back({"model.norm", ModuleKind::FinalNorm, -1});
  p.modules.push_back({"lm_head", ModuleKind::LmHead, -1});
  return p;
}

namespace {

// Throws unless `device` is the whole host or one of the machine's GPUs or NUMA nodes.
void requireOnMachine(const ModulePlacement& m, Device device, const Hardware& machine) {
  if (device == Device::cpu()) return;
  std::string have = "cpu";
  bool found = false;
  for (const GpuSpec& g : machine.gpus) {
    have += ", " + g.device().str();
    found = found || g.device() == device;
  }
  for (const NumaNodeSpec& n : machine.numa_nodes) {
    have += ", " + Device::numaNode(n.id).str();
    found = found || Device::numaNode(n.id) == device;
  }
  if (found || (device.isCpu() && machine.numa_nodes.empty() && device.numaNode() == 0)) return;
  throw Error(m.name + " is on " + device.str() + ", which this machine does not have",
              "use one of: " + have);
}

}  // namespace

void validatePlacement(const Placement& placement, const Hardware* machine) {
  for (const ModulePlacement& m : placement.modules) {
    if (machine) {
      requireOnMachine(m, m.device, *machine);
      if (m.compute_device) requireOnMachine(m, *m.compute_device, *machine);
    }
    if (m.kind != ModuleKind::RoutedExperts) continue;
    if (!listed(kExpertBackends, m.backend)) {
      throw Error(m.name + ": '" + m.backend + "' is not an experts backend",
                  "use one of " + joined(kExpertBackends));
    }
    if (!isExpertFormat(m.weight_format)) {
      throw Error(m.name + ": '" + m.weight_format + "' is not a weight format",
                  "use one of " + joined(expertFormatNames()));
    }
    if (m.device.isGpu()) {
      throw Error(m.name + ": routed-expert weights live in host memory, not on " + m.device.str(),
                  "put them on cpu (or cpu:numaK); backend gpu-offload computes them on a GPU");
    }
    if (m.backend == "gpu-offload") {
      if (!m.compute_device || !m.compute_device->isGpu()) {
        throw Error(m.name + ": gpu-offload needs the GPU that computes them",
                    "set compute_device: cuda:N");
      }
    } else if (m.compute_device) {
      throw Error(m.name + ": compute_device is only for gpu-offload (backend " + m.backend +
                  " computes on the CPU)");
    }
  }
}

std::string defaultWeightFormat(const std::string& backend, const io::ModelConfig& model) {
  // Experts stored in 4 bits or GGUF blocks are computed on as they are, whatever the backend.
  if (!model.stored_expert_format.empty()) return model.stored_expert_format;
  // The AMX backends pack (and so convert) the weights into their own tile format.
  if (backend == "amx_int8") return "int8";
  if (backend == "amx_bf16") return "bf16";
  if (model.quantization && model.quantization->quant_method == "fp8") return "fp8";
  if (model.dtype == "float32") return "fp32";
  if (model.dtype == "float16") return "fp16";
  return "bf16";
}

RuntimePlacement toRuntimePlacement(const Placement& placement) {
  validatePlacement(placement);
  RuntimePlacement r;
  const ModulePlacement* experts = nullptr;
  Device norm_device;
  for (const ModulePlacement& m : placement.modules) {
    switch (m.kind) {
      case ModuleKind::Embedding: r.embed_device = m.device; break;
      case ModuleKind::Attention:
        r.layer_devices.push_back(m.device);
        r.gpu_experts.push_back(0);
        break;
      case ModuleKind::FinalNorm: norm_device = m.device; break;
      case ModuleKind::LmHead:
        if (m.device != norm_device) {
          throw Error("lm_head is on " + m.device.str() + " but model.norm on " + norm_device.str(),
                      "the runtime keeps them together: put both on one device");
        }
        r.head_device = m.device;
        break;
      case ModuleKind::RoutedExperts:
        if (experts &&
            (experts->backend != m.backend || experts->weight_format != m.weight_format)) {
          throw Error(m.name + " uses " + m.backend + "/" + m.weight_format + " but " +
                          experts->name + " " + experts->backend + "/" + experts->weight_format,
                      "the runtime runs every layer's experts with one backend and format");
        }
        if (m.backend == "gpu-offload" && m.compute_device != r.layer_devices.back()) {
          throw Error(m.name + " is computed on " + m.compute_device->str() +
                          " but its layer is on " + r.layer_devices.back().str(),
                      "offloaded experts run on their layer's GPU");
        }
        if (m.gpu_experts > 0 && !r.layer_devices.back().isGpu()) {
          throw Error(m.name + " has " + std::to_string(m.gpu_experts) + " experts resident on " +
                          r.layer_devices.back().str() + ", which is not a GPU",
                      "resident experts live on their layer's GPU: set gpu_experts to 0 for layers "
                      "on the CPU");
        }
        r.gpu_experts.back() = m.gpu_experts;
        experts = &m;
        r.experts_numa_node.resize(
            std::max(r.experts_numa_node.size(), static_cast<size_t>(m.layer) + 1), -1);
        r.experts_numa_node[static_cast<size_t>(m.layer)] = m.device.numaNode();
        break;
      case ModuleKind::Router:
      case ModuleKind::SharedExperts:
      case ModuleKind::DenseMlp:
        if (m.device != r.layer_devices.back()) {
          throw Error(m.name + " is on " + m.device.str() + " but its layer's attention on " +
                          r.layer_devices.back().str(),
                      "the runtime runs a decoder layer's dense parts on one device (plan with "
                      "whole layers)");
        }
        break;
    }
  }
  r.experts_mode = experts && experts->backend == "gpu-offload" ? "gpu-offload" : "cpu";
  r.experts_backend = experts && experts->backend != "gpu-offload" ? experts->backend : "auto";
  r.experts_weight_format = experts ? experts->weight_format : "bf16";
  return r;
}

// --- placement presets ----------------------------------------------------------------------

namespace {

struct LayerRange {
  int first = 0, last = 0;  // inclusive
};

bool parseLayer(std::string_view text, int& out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && out >= 0;
}

LayerRange parseRange(const std::string& text, int num_layers, const std::string& where) {
  const size_t dash = text.find('-');
  const std::string_view first = std::string_view(text).substr(0, dash);
  const std::string_view last =
      dash == std::string::npos ? first : std::string_view(text).substr(dash + 1);
  LayerRange r;
  bool ok = parseLayer(first, r.first);
  if (last.empty()) {
    r.last = num_layers - 1;  // "A-": to the end
  } else {
    ok = ok && parseLayer(last, r.last);
  }
  if (!ok || r.first > r.last)
    throw Error(where + ": '" + text + "' is not a layer range", "write N, A-B or A- (to the end)");
  if (r.last >= num_layers) {
    throw Error(where + ": layer " + std::to_string(r.last) + " is past the model's last layer " +
                std::to_string(num_layers - 1));
  }
  return r;
}

std::string scalar(const YAML::Node& node, const std::string& where) {
  if (!node || !node.IsScalar()) throw Error(where + " is missing or not a text value");
  return node.as<std::string>();
}

}  // namespace

Placement parsePlacementPreset(std::string_view yaml_text, const std::string& label,
                               const io::ModelConfig& model) {
  const YAML::Node root = yaml::parse(yaml_text, label);
  yaml::onlyKeys(root, label, {"name", "embed_tokens", "lm_head", "experts", "layers"});
  Placement p = modulesOf(model);
  const Device embed = Device::parse(scalar(root["embed_tokens"], label + ": embed_tokens"),
                                     label + ": embed_tokens");
  const Device head =
      Device::parse(scalar(root["lm_head"], label + ": lm_head"), label + ": lm_head");
  const YAML::Node experts = root["experts"];
  if (!experts)
    throw Error(label + ": experts is missing", "e.g. experts: {device: cpu, backend: auto}");
  yaml::onlyKeys(experts, label + ": experts", {"device", "backend", "weight_format"});
  const Device experts_device =
      experts["device"] ? Device::parse(scalar(experts["device"], label + ": experts.device"),
                                        label + ": experts.device")
                        : Device::cpu();
  const std::string backend =
      experts["backend"] ? scalar(experts["backend"], label + ": experts.backend") : "auto";
  const std::string format =
      experts["weight_format"] ? scalar(experts["weight_format"], label + ": experts.weight_format")
                               : defaultWeightFormat(backend, model);
  std::vector<std::optional<Device>> layer_device(static_cast<size_t>(model.num_hidden_layers));
  const YAML::Node layers = root["layers"];
  if (!layers || !layers.IsSequence())
    throw Error(label + ": layers must be a list of {layers: A-B, device: D}");
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string where = label + ": layers[" + std::to_string(i) + "]";
    yaml::onlyKeys(layers[i], where, {"layers", "device"});
    const LayerRange range =
        parseRange(scalar(layers[i]["layers"], where + ".layers"), model.num_hidden_layers, where);
    const Device device =
        Device::parse(scalar(layers[i]["device"], where + ".device"), where + ".device");
    for (int l = range.first; l <= range.last; ++l) layer_device[static_cast<size_t>(l)] = device;
  }
  for (size_t l = 0; l < layer_device.size(); ++l) {
    if (!layer_device[l])
      throw Error(label + ": layer " + std::to_string(l) + " has no device",
                  "cover every layer in layers:");
  }
  for (ModulePlacement& m : p.modules) {
    switch (m.kind) {
      case ModuleKind::Embedding: m.device = embed; break;
      case ModuleKind::FinalNorm:
      case ModuleKind::LmHead: m.device = head; break;
      case ModuleKind::RoutedExperts:
        m.device = experts_device;
        m.backend = backend;
        m.weight_format = format;
        if (backend == "gpu-offload") m.compute_device = layer_device[static_cast<size_t>(m.layer)];
        break;
      default: m.device = *layer_device[static_cast<size_t>(m.layer)];
    }
  }
  try {
    validatePlacement(p);
  } catch (const Error& e) {
    throw Error(label + ": " + e.message(), e.whatToDo());
  }
  return p;
}

Placement loadPlacementPreset(const std::filesystem::path& file, const io::ModelConfig& model) {
  return parsePlacementPreset(yaml::readFile(file, "placement preset", "check the path"),
                              file.string(), model);
}

}  // namespace tandem::placement
