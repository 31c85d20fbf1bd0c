#include "engine/placement/placement.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <utility>

#include "engine/core/error.h"
#include "engine/placement/yaml_file.h"

namespace tandem::placement {

namespace {

bool parseIndex(std::string_view text, int& out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && out >= 0;
}

bool isGpu(const std::string& device) { return device.starts_with("cuda:"); }

template <size_t N>
bool listed(const std::string_view (&list)[N], const std::string& value) {
  return std::find(std::begin(list), std::end(list), value) != std::end(list);
}

template <size_t N>
std::string joined(const std::string_view (&list)[N]) {
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

std::vector<std::string> Placement::layerDevices() const {
  std::vector<std::string> out;
  for (const ModulePlacement& m : modules) {
    if (m.kind != ModuleKind::Attention) continue;
    const auto layer = static_cast<size_t>(m.layer);
    if (out.size() <= layer) out.resize(layer + 1);
    out[layer] = m.device;
  }
  return out;
}

std::vector<std::string> Placement::devices() const {
  std::vector<std::string> out;
  auto add = [&](const std::string& d) {
    if (!d.empty() && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  };
  for (const ModulePlacement& m : modules) {
    add(m.device);
    add(m.compute_device);
  }
  // GPUs by index, then cpu, then NUMA nodes by index.
  auto rank = [](const std::string& d) {
    int index = 0;
    if (isGpu(d)) return parseIndex(std::string_view(d).substr(5), index) ? index : 0;
    if (d == "cpu") return 1 << 20;
    parseIndex(std::string_view(d).substr(8), index);
    return (1 << 20) + 1 + index;
  };
  std::sort(out.begin(), out.end(), [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
  return out;
}

Placement modulesOf(const io::ModelConfig& model) {
  if (model.num_hidden_layers <= 0) throw Error("the model has no decoder layers (num_hidden_layers)");
  Placement p;
  p.modules.push_back({"model.embed_tokens", ModuleKind::Embedding, -1, "", "", "", ""});
  const bool qwen2_shared = model.architecture == io::Architecture::Qwen2Moe && model.shared_expert_intermediate_size > 0;
  const bool deepseek_shared = (model.architecture == io::Architecture::DeepseekV2 ||
                                model.architecture == io::Architecture::DeepseekV3) && model.n_shared_experts > 0;
  for (int l = 0; l < model.num_hidden_layers; ++l) {
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    p.modules.push_back({prefix + "self_attn", ModuleKind::Attention, l, "", "", "", ""});
    if (model.isMoeLayer(l)) {
      p.modules.push_back({prefix + "mlp.gate", ModuleKind::Router, l, "", "", "", ""});
      if (qwen2_shared) p.modules.push_back({prefix + "mlp.shared_expert", ModuleKind::SharedExperts, l, "", "", "", ""});
      if (deepseek_shared) p.modules.push_back({prefix + "mlp.shared_experts", ModuleKind::SharedExperts, l, "", "", "", ""});
      p.modules.push_back({prefix + "mlp.experts", ModuleKind::RoutedExperts, l, "", "", "", ""});
    } else {
      p.modules.push_back({prefix + "mlp", ModuleKind::DenseMlp, l, "", "", "", ""});
    }
  }
  p.modules.push_back({"model.norm", ModuleKind::FinalNorm, -1, "", "", "", ""});
  p.modules.push_back({"lm_head", ModuleKind::LmHead, -1, "", "", "", ""});
  return p;
}

void checkDevice(const std::string& device, const std::string& where) {
  int index = 0;
  if (device == "cpu") return;
  if (device.starts_with("cuda:") && parseIndex(std::string_view(device).substr(5), index)) return;
  if (device.starts_with("cpu:numa") && parseIndex(std::string_view(device).substr(8), index)) return;
  throw Error(where + ": '" + device + "' is not a device", "use cuda:N, cpu or cpu:numaK");
}

void validatePlacement(const Placement& placement, int gpus, int numa_nodes) {
  for (const ModulePlacement& m : placement.modules) {
    if (m.device.empty()) throw Error(m.name + " has no device", "place every module (or let the planner do it)");
    checkDevice(m.device, m.name);
    int index = 0;
    if (gpus >= 0 && isGpu(m.device) && parseIndex(std::string_view(m.device).substr(5), index) && index >= gpus) {
      throw Error(m.name + " is on " + m.device + ", but the machine has " + std::to_string(gpus) + " GPU(s)",
                  gpus > 0 ? "use cuda:0 to cuda:" + std::to_string(gpus - 1) + " or cpu" : "use cpu");
    }
    if (numa_nodes >= 0 && m.device.starts_with("cpu:numa") &&
        parseIndex(std::string_view(m.device).substr(8), index) && index >= numa_nodes) {
      throw Error(m.name + " is on " + m.device + ", but the machine has " + std::to_string(numa_nodes) + " NUMA node(s)",
                  "use cpu or cpu:numa0 to cpu:numa" + std::to_string(numa_nodes - 1));
    }
    if (m.kind != ModuleKind::RoutedExperts) continue;
    if (!listed(kExpertBackends, m.backend)) {
      throw Error(m.name + ": '" + m.backend + "' is not an experts backend", "use one of " + joined(kExpertBackends));
    }
    if (!listed(kWeightFormats, m.weight_format)) {
      throw Error(m.name + ": '" + m.weight_format + "' is not a weight format", "use one of " + joined(kWeightFormats));
    }
    if (isGpu(m.device)) {
      throw Error(m.name + ": routed-expert weights live in host memory, not on " + m.device,
                  "put them on cpu (or cpu:numaK); backend gpu-offload computes them on a GPU");
    }
    if (m.backend == "gpu-offload") {
      if (!isGpu(m.compute_device)) {
        throw Error(m.name + ": gpu-offload needs the GPU that computes them", "set compute_device: cuda:N");
      }
    } else if (!m.compute_device.empty()) {
      throw Error(m.name + ": compute_device is only for gpu-offload (backend " + m.backend + " computes on the CPU)");
    }
  }
}

std::string defaultWeightFormat(const std::string& backend, const io::ModelConfig& model) {
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
  std::string norm_device;
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
          throw Error("lm_head is on " + m.device + " but model.norm on " + norm_device,
                      "the runtime keeps them together: put both on one device");
        }
        r.head_device = m.device;
        break;
      case ModuleKind::RoutedExperts:
        if (experts && (experts->backend != m.backend || experts->weight_format != m.weight_format)) {
          throw Error(m.name + " uses " + m.backend + "/" + m.weight_format + " but " + experts->name + " " +
                      experts->backend + "/" + experts->weight_format,
                      "the runtime runs every layer's experts with one backend and format");
        }
        if (m.backend == "gpu-offload" && m.compute_device != r.layer_devices.back()) {
          throw Error(m.name + " is computed on " + m.compute_device + " but its layer is on " +
                      r.layer_devices.back(), "offloaded experts run on their layer's GPU");
        }
        if (m.gpu_experts > 0 && !r.layer_devices.back().starts_with("cuda:")) {
          throw Error(m.name + " has " + std::to_string(m.gpu_experts) + " experts resident on " +
                          r.layer_devices.back() + ", which is not a GPU",
                      "resident experts live on their layer's GPU: set gpu_experts to 0 for layers on the CPU");
        }
        r.gpu_experts.back() = m.gpu_experts;
        experts = &m;
        r.experts_numa_node.resize(std::max(r.experts_numa_node.size(), static_cast<size_t>(m.layer) + 1), -1);
        if (m.device.starts_with("cpu:numa")) r.experts_numa_node[static_cast<size_t>(m.layer)] = std::stoi(m.device.substr(8));
        break;
      case ModuleKind::Router:
      case ModuleKind::SharedExperts:
      case ModuleKind::DenseMlp:
        if (m.device != r.layer_devices.back()) {
          throw Error(m.name + " is on " + m.device + " but its layer's attention on " + r.layer_devices.back(),
                      "the runtime runs a decoder layer's dense parts on one device (plan with whole layers)");
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

LayerRange parseRange(const std::string& text, int num_layers, const std::string& where) {
  const size_t dash = text.find('-');
  const std::string_view first = std::string_view(text).substr(0, dash);
  const std::string_view last = dash == std::string::npos ? first : std::string_view(text).substr(dash + 1);
  LayerRange r;
  bool ok = parseIndex(first, r.first);
  if (last.empty()) {
    r.last = num_layers - 1;  // "A-": to the end
  } else {
    ok = ok && parseIndex(last, r.last);
  }
  if (!ok || r.first > r.last) throw Error(where + ": '" + text + "' is not a layer range", "write N, A-B or A- (to the end)");
  if (r.last >= num_layers) {
    throw Error(where + ": layer " + std::to_string(r.last) + " is past the model's last layer " + std::to_string(num_layers - 1));
  }
  return r;
}

std::string scalar(const YAML::Node& node, const std::string& where) {
  if (!node || !node.IsScalar()) throw Error(where + " is missing or not a text value");
  return node.as<std::string>();
}

}  // namespace

Placement parsePlacementPreset(std::string_view yaml_text, const std::string& label, const io::ModelConfig& model) {
  const YAML::Node root = yaml::parse(yaml_text, label);
  yaml::onlyKeys(root, label, {"name", "embed_tokens", "lm_head", "experts", "layers"});
  Placement p = modulesOf(model);
  const std::string embed = scalar(root["embed_tokens"], label + ": embed_tokens");
  const std::string head = scalar(root["lm_head"], label + ": lm_head");
  checkDevice(embed, label + ": embed_tokens");
  checkDevice(head, label + ": lm_head");
  const YAML::Node experts = root["experts"];
  if (!experts) throw Error(label + ": experts is missing", "e.g. experts: {device: cpu, backend: auto}");
  yaml::onlyKeys(experts, label + ": experts", {"device", "backend", "weight_format"});
  const std::string experts_device = experts["device"] ? scalar(experts["device"], label + ": experts.device") : "cpu";
  const std::string backend = experts["backend"] ? scalar(experts["backend"], label + ": experts.backend") : "auto";
  const std::string format = experts["weight_format"] ? scalar(experts["weight_format"], label + ": experts.weight_format")
                                                      : defaultWeightFormat(backend, model);
  std::vector<std::string> layer_device(static_cast<size_t>(model.num_hidden_layers));
  const YAML::Node layers = root["layers"];
  if (!layers || !layers.IsSequence()) throw Error(label + ": layers must be a list of {layers: A-B, device: D}");
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string where = label + ": layers[" + std::to_string(i) + "]";
    yaml::onlyKeys(layers[i], where, {"layers", "device"});
    const LayerRange range = parseRange(scalar(layers[i]["layers"], where + ".layers"), model.num_hidden_layers, where);
    const std::string device = scalar(layers[i]["device"], where + ".device");
    checkDevice(device, where + ".device");
    for (int l = range.first; l <= range.last; ++l) layer_device[static_cast<size_t>(l)] = device;
  }
  for (size_t l = 0; l < layer_device.size(); ++l) {
    if (layer_device[l].empty()) throw Error(label + ": layer " + std::to_string(l) + " has no device", "cover every layer in layers:");
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
      default: m.device = layer_device[static_cast<size_t>(m.layer)];
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
  return parsePlacementPreset(yaml::readFile(file, "placement preset", "check the path"), file.string(), model);
}

}  // namespace tandem::placement
