#include "engine/placement/kt_rules.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <memory>
#include <set>

#include "engine/core/error.h"
#include "engine/placement/yaml_file.h"

namespace tandem::placement {

namespace {

using io::Architecture;

// --- regexes: Python re.match semantics (anchored at the start, not the end) -----------------

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
using Regex = std::unique_ptr<pcre2_code, CodeDeleter>;

Regex compileRegex(const std::string& pattern, const std::string& where) {
  int error_code = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_ANCHORED, &error_code, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof message);
    throw Error(where + ": match.name '" + pattern + "' is not a valid regex (at offset " +
                std::to_string(offset) + ": " + reinterpret_cast<const char*>(message) + ")");
  }
  return Regex(code);
}

bool regexMatches(const pcre2_code* code, const std::string& subject) {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  return pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0, 0,
                     data.get(), nullptr) >= 0;
}

std::string lastComponent(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  return dot == std::string::npos ? dotted : dotted.substr(dot + 1);
}

// --- what our modules are called in KTransformers' world --------------------------------------

std::string classPrefix(Architecture arch) {
  switch (arch) {
    case Architecture::DeepseekV3: return "DeepseekV3";
    case Architecture::DeepseekV2: return "DeepseekV2";
    case Architecture::Qwen3Moe: return "Qwen3Moe";
    case Architecture::Qwen2Moe: return "Qwen2Moe";
    case Architecture::Mixtral: return "Mixtral";
    case Architecture::Llama: return "Llama";
    case Architecture::Qwen2: return "Qwen2";
    case Architecture::Qwen3: return "Qwen3";
  }
  return "";
}

bool isDeepseek(Architecture arch) {
  return arch == Architecture::DeepseekV2 || arch == Architecture::DeepseekV3;
}

// The HF / KT modeling classes a module of this kind is an instance of (match.class).
std::set<std::string> moduleClasses(ModuleKind kind, Architecture arch) {
  const std::string p = classPrefix(arch);
  switch (kind) {
    case ModuleKind::Embedding: return {"Embedding"};
    case ModuleKind::Attention: return {p + "Attention", p + "FlashAttention2"};
    case ModuleKind::Router:
      return isDeepseek(arch) ? std::set<std::string>{"MoEGate", p + "TopkRouter"}
                              : std::set<std::string>{"Linear"};
    case ModuleKind::SharedExperts:
    case ModuleKind::DenseMlp: return {p + "MLP"};
    case ModuleKind::RoutedExperts: return {"ModuleList", p + "Experts", p + "NaiveMoe"};
    case ModuleKind::FinalNorm: return {p + "RMSNorm"};
    case ModuleKind::LmHead: return {"Linear"};
  }
  return {};
}

// KT replace classes Tandem understands, per kind (by last component). "default" fits all.
std::set<std::string> replaceClasses(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::Attention:
      return {"KDeepseekV2Attention", "KDeepseekV3Attention", "KQwen3MoeAttention",
              "KQwen2MoeAttention",   "KLlamaAttention",      "KMixtralAttention"};
    case ModuleKind::Router: return {"KMoEGate", "KMoEGateDeepSeekV3", "KTransformersLinear"};
    case ModuleKind::RoutedExperts: return {"KTransformersExperts"};
    case ModuleKind::FinalNorm:
      return {"RMSNorm", "KDeepseekRMSNorm", "KQwen3MoeRMSNorm", "KQwen2MoeRMSNorm"};
    case ModuleKind::LmHead: return {"KTransformersLinear"};
    case ModuleKind::Embedding:
    case ModuleKind::SharedExperts:
    case ModuleKind::DenseMlp: return {};
  }
  return {};
}

// Mixtral checkpoints (and KT's modeling) call the MoE block block_sparse_moe.
std::string ktName(const ModulePlacement& m, Architecture arch) {
  if (arch != Architecture::Mixtral || m.layer < 0) return m.name;
  std::string name = m.name;
  const std::string from = ".mlp.", to = ".block_sparse_moe.";
  if (const size_t at = name.find(from); at != std::string::npos) name.replace(at, from.size(), to);
  return name;
}

const std::set<std::string>& knownKwargs() {
  static const std::set<std::string> known = {
      "generate_device",      "prefill_device",
      "out_device",           "backend",
      "generate_op",          "prefill_op",
      "absorb_for_prefill",   "per_layer_prefill_intput_threshold",
      "transfer_map",         "chunck_size",
      "use_cuda_graph",       "tandem_backend",
      "tandem_weight_format", "tandem_numa_node",
      "tandem_gpu_experts"};
  return known;
}

// --- reading -----------------------------------------------------------------------------------

KtRule parseRule(const YAML::Node& node, int number, const std::string& label) {
  const std::string where = label + ": rule " + std::to_string(number);
  if (!node.IsMap()) throw Error(where + " must be a block with match: and replace:");
  KtRule rule;
  rule.number = number;
  for (const auto& item : node) {
    const std::string key = yaml::keyText(item.first, where);
    if (key != "match" && key != "replace" && key != "recursive") {
      throw Error(where + ": unknown key '" + key + "'",
                  "a rule has match, replace and optionally recursive");
    }
  }
  const YAML::Node match = node["match"];
  if (!match || !match.IsMap())
    throw Error(where + ": match is missing or not a block of name/class");
  for (const auto& item : match) {
    const std::string key = yaml::keyText(item.first, where + ": match");
    if (key == "name")
      rule.name_regex = yaml::text(item.second, where + ": match.name");
    else if (key == "class")
      rule.match_class = yaml::text(item.second, where + ": match.class");
    else
      throw Error(where + ": match: unknown key '" + key + "'",
                  "match takes name (a regex) and class");
  }
  if (rule.name_regex.empty() && rule.match_class.empty())
    throw Error(where + ": match has neither name nor class");
  const YAML::Node replace = node["replace"];
  if (!replace || !replace.IsMap())
    throw Error(where + ": replace is missing or not a block of class/kwargs");
  for (const auto& item : replace) {
    const std::string key = yaml::keyText(item.first, where + ": replace");
    if (key == "class") {
      rule.replace_class = yaml::text(item.second, where + ": replace.class");
    } else if (key == "kwargs") {
      if (item.second.IsNull()) continue;
      if (!item.second.IsMap())
        throw Error(where + ": replace.kwargs must be a block of `key: value` lines");
      for (const auto& kw : item.second) {
        const std::string name = yaml::keyText(kw.first, where + ": replace.kwargs");
        if (kw.second.IsScalar())
          rule.kwargs[name] = kw.second.Scalar();
        else
          rule.structured_kwargs[name] = yaml::kindName(kw.second);
      }
    } else {
      throw Error(where + ": replace: unknown key '" + key + "'", "replace takes class and kwargs");
    }
  }
  if (rule.replace_class.empty()) rule.replace_class = "default";
  if (const YAML::Node recursive = node["recursive"]) {
    bool value = true;
    if (!YAML::convert<bool>::decode(recursive, value))
      throw Error(where + ": recursive must be True or False");
    rule.recursive = value;
  }
  if (!rule.name_regex.empty()) compileRegex(rule.name_regex, where);
  return rule;
}

struct Matched {
  const KtRule* rule = nullptr;
  std::string where;  // "rule N (…) for <module>"

  std::string kwarg(const std::string& key) const {
    if (auto s = rule->structured_kwargs.find(key); s != rule->structured_kwargs.end())
      throw Error(where + ": kwarg " + key + " must be a text value, not a " + s->second);
    auto it = rule->kwargs.find(key);
    return it == rule->kwargs.end() ? "" : it->second;
  }
};

// Experts' backend: KT's backend kwarg, or Tandem's own when the file was written by Tandem.
void placeExperts(ModulePlacement& m, const Matched& hit, const io::ModelConfig& model) {
  std::string generate = hit.kwarg("generate_device");
  if (lastComponent(hit.rule->replace_class) == "default" && !hit.kwarg("prefill_device").empty()) {
    generate = hit.kwarg("prefill_device");
  }
  // Device::parse reads KTransformers' "cuda" as cuda:0.
  const Device device =
      generate.empty() ? Device::cpu() : Device::parse(generate, hit.where + ": generate_device");
  std::string backend = hit.kwarg("tandem_backend");
  const std::string kt_backend = hit.kwarg("backend");
  if (backend.empty()) {
    std::string b = kt_backend;
    std::transform(b.begin(), b.end(), b.begin(), [](unsigned char c) { return std::tolower(c); });
    if (b == "amxint8")
      backend = "amx_int8";
    else if (b == "amxbf16")
      backend = "amx_bf16";
    else if (b.empty() || b == "llamafile")
      backend = "auto";  // llamafile: KT's default CPU kernels
    else
      throw Error(
          hit.where + ": backend '" + kt_backend + "' is not one Tandem has",
          "use AMXInt8, AMXBF16 or llamafile (Tandem picks the best CPU kernels for llamafile)");
  }
  if (device.isGpu()) {
    // KT experts generated on a GPU: Tandem's equivalent streams them there from host memory.
    m.device = Device::cpu();
    m.backend = "gpu-offload";
    m.compute_device = device;
  } else {
    m.device = device;
    m.backend = backend;
    m.compute_device.reset();
    if (backend == "gpu-offload")
      throw Error(hit.where + ": gpu-offload needs generate_device: cuda:N");
  }
  if (const std::string numa = hit.kwarg("tandem_numa_node"); !numa.empty()) {
    if (m.device != Device::cpu())
      throw Error(hit.where + ": tandem_numa_node needs generate_device: cpu");
    m.device = Device::parse("cpu:numa" + numa, hit.where + ": tandem_numa_node");
  }
  const std::string format = hit.kwarg("tandem_weight_format");
  m.weight_format = format.empty() ? defaultWeightFormat(m.backend, model) : format;
  if (const std::string resident = hit.kwarg("tandem_gpu_experts"); !resident.empty()) {
    // The count the placement board (or a user) fixed for these layers: the planner keeps it.
    int64_t n = -1;
    const auto [end, error] =
        std::from_chars(resident.data(), resident.data() + resident.size(), n);
    if (error != std::errc() || end != resident.data() + resident.size() || n < 0 ||
        n > model.num_experts) {
      throw Error(hit.where + ": tandem_gpu_experts '" + resident + "' is not a count of experts",
                  "use a whole number from 0 to " + std::to_string(model.num_experts) +
                      " (the model's routed experts per layer)");
    }
    m.gpu_experts = n;
    m.gpu_experts_fixed = true;
  }
}

void placeFromRule(ModulePlacement& m, const Matched& hit, const io::ModelConfig& model) {
  const std::string cls = lastComponent(hit.rule->replace_class);
  const std::set<std::string> allowed = replaceClasses(m.kind);
  if (cls != "default" && !allowed.contains(cls)) {
    std::string known = "default";
    for (const std::string& c : allowed) known += ", " + c;
    throw Error(hit.where + ": replace class '" + hit.rule->replace_class +
                    "' is not one Tandem knows for " + std::string(moduleKindName(m.kind)),
                "use " + known + " (docs/placement.md lists the mapping)");
  }
  std::vector<std::string> keys;
  for (const auto& [key, value] : hit.rule->kwargs) keys.push_back(key);
  for (const auto& [key, kind] : hit.rule->structured_kwargs) keys.push_back(key);
  for (const std::string& key : keys) {
    if (!knownKwargs().contains(key)) {
      throw Error(hit.where + ": kwarg '" + key + "' is not one Tandem knows",
                  "docs/placement.md lists the kwargs Tandem reads and those it ignores");
    }
    if (key.starts_with("tandem_") && m.kind != ModuleKind::RoutedExperts) {
      throw Error(hit.where + ": " + key + " only applies to routed experts");
    }
  }
  if (m.kind == ModuleKind::RoutedExperts) {
    // "default" keeps KT's plain experts on the rule's device: on a GPU that is Tandem's offload.
    placeExperts(m, hit, model);
    return;
  }
  if (!hit.kwarg("backend").empty())
    throw Error(hit.where + ": backend only applies to routed experts");
  // Training runs whole sequences: KT's prefill path. generate_device when prefill is not given.
  std::string device = hit.kwarg("prefill_device");
  if (device.empty()) device = hit.kwarg("generate_device");
  m.device = device.empty() ? Device::cuda(0) : Device::parse(device, hit.where + ": device");
}

std::string describe(const KtRule& rule, const std::string& label) {
  std::string text = label + ": rule " + std::to_string(rule.number) + " (";
  text += rule.name_regex.empty() ? "class " + rule.match_class : "name " + rule.name_regex;
  return text + ")";
}

// --- writing -----------------------------------------------------------------------------------

std::string layerAlternation(const std::vector<int>& layers) {
  std::string out = "(";
  for (size_t i = 0; i < layers.size(); ++i) out += (i ? "|" : "") + std::to_string(layers[i]);
  return out + ")";
}

std::string attentionClass(Architecture arch) {
  switch (arch) {
    case Architecture::DeepseekV2:
    case Architecture::DeepseekV3: return "ktransformers.operators.attention.KDeepseekV2Attention";
    case Architecture::Qwen3Moe: return "ktransformers.operators.attention.KQwen3MoeAttention";
    case Architecture::Qwen2Moe: return "ktransformers.operators.attention.KQwen2MoeAttention";
    default: return "default";
  }
}

// The KT class of the whole MoE block (match) and its replacement, which KT needs so that the
// experts get their custom forward.
std::pair<std::string, std::string> moeBlockClasses(Architecture arch) {
  switch (arch) {
    case Architecture::DeepseekV3:
      return {"ktransformers.models.modeling_deepseek_v3.DeepseekV3MoE",
              "ktransformers.operators.experts.KDeepseekV3MoE"};
    case Architecture::DeepseekV2:
      return {"ktransformers.models.modeling_deepseek.DeepseekV2MoE",
              "ktransformers.operators.experts.KDeepseekV2MoE"};
    case Architecture::Qwen3Moe:
      return {"ktransformers.models.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
              "ktransformers.operators.experts.KQwen3MoeSparseMoeBlock"};
    case Architecture::Qwen2Moe:
      return {"ktransformers.models.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
              "ktransformers.operators.experts.KQwen2MoeSparseMoeBlock"};
    case Architecture::Mixtral:
      return {"ktransformers.models.modeling_mixtral.MixtralSparseMoeBlock",
              "ktransformers.operators.experts.KMistralSparseMoEBlock"};
    default: return {"", ""};
  }
}

// KT's whole-model class, which moves the hidden states between GPUs (transfer_map).
std::string modelClass(Architecture arch) {
  switch (arch) {
    case Architecture::DeepseekV2:
    case Architecture::DeepseekV3: return "ktransformers.operators.models.KDeepseekV2Model";
    case Architecture::Qwen3Moe: return "ktransformers.operators.models.KQwen3MoeModel";
    case Architecture::Qwen2Moe: return "ktransformers.operators.models.KQwen2MoeModel";
    default: return "";
  }
}

struct Group {
  ModuleKind kind;
  std::string suffix;  // after "model.layers.N." in KT naming
  ModulePlacement sample;
  Device layer_device;  // the layer's attention device (experts' out_device)
  std::vector<int> layers;
};

void emitDevices(YAML::Emitter& out, Device device) {
  out << YAML::Key << "generate_device" << YAML::Value << YAML::DoubleQuoted << device.str();
  out << YAML::Key << "prefill_device" << YAML::Value << YAML::DoubleQuoted << device.str();
}

void emitRule(YAML::Emitter& out, const std::string& name, const std::string& match_class,
              const std::string& replace_class, const std::function<void()>& kwargs,
              bool non_recursive = false) {
  out << YAML::BeginMap << YAML::Key << "match" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << name;
  if (!match_class.empty()) out << YAML::Key << "class" << YAML::Value << match_class;
  out << YAML::EndMap << YAML::Key << "replace" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "class" << YAML::Value << replace_class;
  out << YAML::Key << "kwargs" << YAML::Value << YAML::BeginMap;
  kwargs();
  out << YAML::EndMap << YAML::EndMap;
  if (non_recursive) out << YAML::Key << "recursive" << YAML::Value << "False";
  out << YAML::EndMap;
}

void emitExperts(YAML::Emitter& out, const Group& g, const std::string& name,
                 const io::ModelConfig& model) {
  const ModulePlacement& m = g.sample;
  emitRule(
      out, name, "", "ktransformers.operators.experts.KTransformersExperts",
      [&] {
        const bool offload = m.backend == "gpu-offload";
        out << YAML::Key << "prefill_device" << YAML::Value << YAML::DoubleQuoted
            << g.layer_device.str();
        out << YAML::Key << "prefill_op" << YAML::Value << "KExpertsTorch";
        out << YAML::Key << "generate_device" << YAML::Value << YAML::DoubleQuoted
            << (offload ? m.compute_device->str() : Device::cpu().str());
        out << YAML::Key << "generate_op" << YAML::Value
            << (offload ? "KExpertsTorch" : "KSFTExpertsCPU");
        out << YAML::Key << "out_device" << YAML::Value << YAML::DoubleQuoted
            << g.layer_device.str();
        if (m.backend == "amx_int8")
          out << YAML::Key << "backend" << YAML::Value << YAML::DoubleQuoted << "AMXInt8";
        else if (m.backend == "amx_bf16")
          out << YAML::Key << "backend" << YAML::Value << YAML::DoubleQuoted << "AMXBF16";
        else if (m.backend != "auto")
          out << YAML::Key << "tandem_backend" << YAML::Value << m.backend;
        if (m.device.numaNode() >= 0) {
          out << YAML::Key << "tandem_numa_node" << YAML::Value
              << std::to_string(m.device.numaNode());
        }
        if (m.weight_format != defaultWeightFormat(m.backend, model)) {
          out << YAML::Key << "tandem_weight_format" << YAML::Value << m.weight_format;
        }
        if (m.gpu_experts_fixed) {
          out << YAML::Key << "tandem_gpu_experts" << YAML::Value << std::to_string(m.gpu_experts);
        }
      },
      /*non_recursive=*/true);
}

}  // namespace

KtRuleFile parseKtRules(std::string_view yaml_text, const std::string& label) {
  const YAML::Node root = yaml::parse(yaml_text, label);
  if (!root.IsSequence())
    throw Error(label + ": a rule file is a list of `- match: ... replace: ...` rules");
  KtRuleFile file;
  file.label = label;
  for (size_t i = 0; i < root.size(); ++i)
    file.rules.push_back(parseRule(root[i], static_cast<int>(i) + 1, label));
  return file;
}

KtRuleFile loadKtRules(const std::filesystem::path& file) {
  return parseKtRules(yaml::readFile(file, "the rule file", "check kt_optimize_rule's path"),
                      file.string());
}

Placement applyKtRules(const KtRuleFile& file, const io::ModelConfig& model) {
  std::vector<Regex> regexes;
  for (const KtRule& rule : file.rules) {
    regexes.push_back(rule.name_regex.empty()
                          ? Regex()
                          : compileRegex(rule.name_regex, describe(rule, file.label)));
  }
  Placement p = modulesOf(model);
  for (ModulePlacement& m : p.modules) {
    const std::string name = ktName(m, model.architecture);
    const std::set<std::string> classes = moduleClasses(m.kind, model.architecture);
    Matched hit;
    for (size_t i = 0; i < file.rules.size() && !hit.rule; ++i) {
      const KtRule& rule = file.rules[i];
      if (regexes[i] && !regexMatches(regexes[i].get(), name)) continue;
      if (!rule.match_class.empty() && !classes.contains(lastComponent(rule.match_class))) continue;
      hit.rule = &rule;
      hit.where = describe(rule, file.label) + " for " + m.name;
    }
    if (hit.rule) {
      placeFromRule(m, hit, model);
    } else if (m.kind == ModuleKind::RoutedExperts) {
      m.device = Device::cpu();
      m.backend = "auto";
      m.weight_format = defaultWeightFormat("auto", model);
    } else {
      m.device = Device::cuda(0);
    }
  }
  return p;
}

Placement loadPlacementFile(const std::filesystem::path& file, const io::ModelConfig& model) {
  const std::string text =
      yaml::readFile(file, "the placement file", "check kt_optimize_rule's path");
  if (yaml::parse(text, file.string()).IsSequence())
    return applyKtRules(parseKtRules(text, file.string()), model);
  return parsePlacementPreset(text, file.string(), model);
}

std::string writeKtRules(const Placement& placement, const io::ModelConfig& model) {
  validatePlacement(placement);
  const Architecture arch = model.architecture;
  const bool mixtral = arch == Architecture::Mixtral;
  const std::string moe_name = mixtral ? "block_sparse_moe" : "mlp";
  // Group layer modules by what the rule says, keeping first-appearance order.
  std::vector<Group> groups;
  std::vector<Device> attention_device = placement.layerDevices();
  attention_device.resize(static_cast<size_t>(model.num_hidden_layers));
  std::vector<std::pair<Device, std::vector<int>>> moe_blocks;  // device -> MoE layers
  for (const ModulePlacement& m : placement.modules) {
    if (m.layer < 0) continue;
    const std::string prefix = "model.layers." + std::to_string(m.layer) + ".";
    std::string suffix = ktName(m, arch).substr(prefix.size());
    const Device layer_device = attention_device[static_cast<size_t>(m.layer)];
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.suffix == suffix && g.sample.device == m.device && g.sample.backend == m.backend &&
             g.sample.weight_format == m.weight_format &&
             g.sample.compute_device == m.compute_device &&
             g.sample.gpu_experts_fixed == m.gpu_experts_fixed &&
             (!m.gpu_experts_fixed || g.sample.gpu_experts == m.gpu_experts) &&
             (m.kind != ModuleKind::RoutedExperts || g.layer_device == layer_device);
    });
    if (it == groups.end()) {
      groups.push_back({m.kind, suffix, m, layer_device, {}});
      it = groups.end() - 1;
    }
    it->layers.push_back(m.layer);
    if (m.kind == ModuleKind::Router) {
      auto block = std::find_if(moe_blocks.begin(), moe_blocks.end(),
                                [&](const auto& b) { return b.first == layer_device; });
      if (block == moe_blocks.end())
        block = moe_blocks.insert(moe_blocks.end(), {layer_device, {}});
      block->second.push_back(m.layer);
    }
  }
  YAML::Emitter out;
  out << YAML::BeginSeq;
  const ModulePlacement* embed = placement.find("model.embed_tokens");
  emitRule(out, "^model\\.embed_tokens$", "", "default", [&] { emitDevices(out, embed->device); });
  const auto [moe_class, moe_replace] = moeBlockClasses(arch);
  for (const auto& [device, layers] : moe_blocks) {
    emitRule(out, "^model\\.layers\\." + layerAlternation(layers) + "\\." + moe_name + "$",
             moe_class, moe_replace, [&, d = device] { emitDevices(out, d); });
  }
  for (const Group& g : groups) {
    std::string escaped;
    for (char c : g.suffix) escaped += c == '.' ? std::string("\\.") : std::string(1, c);
    const std::string name =
        "^model\\.layers\\." + layerAlternation(g.layers) + "\\." + escaped + "$";
    switch (g.kind) {
      case ModuleKind::RoutedExperts: emitExperts(out, g, name, model); break;
      case ModuleKind::Attention:
        emitRule(out, name, "", attentionClass(arch), [&] { emitDevices(out, g.sample.device); });
        break;
      case ModuleKind::Router:
        emitRule(out, name,
                 isDeepseek(arch) ? "ktransformers.models.modeling_deepseek_v3.MoEGate"
                                  : "torch.nn.Linear",
                 isDeepseek(arch) ? "ktransformers.operators.gate.KMoEGate" : "default",
                 [&] { emitDevices(out, g.sample.device); });
        break;
      default: emitRule(out, name, "", "default", [&] { emitDevices(out, g.sample.device); });
    }
  }
  // KT sends every module no rule matches (the Linears inside attention, rotary embeddings) to
  // cuda:0; LLaMA-Factory's files end with catch-alls per GPU, and so do these.
  std::vector<std::pair<Device, std::vector<int>>> layers_by_device;
  for (int l = 0; l < model.num_hidden_layers; ++l) {
    const Device d = attention_device[static_cast<size_t>(l)];
    auto it = std::find_if(layers_by_device.begin(), layers_by_device.end(),
                           [&](const auto& e) { return e.first == d; });
    if (it == layers_by_device.end()) it = layers_by_device.insert(layers_by_device.end(), {d, {}});
    it->second.push_back(l);
  }
  if (const std::string cls = modelClass(arch); !cls.empty()) {
    emitRule(out, "^model$", "", cls, [&] {
      out << YAML::Key << "per_layer_prefill_intput_threshold" << YAML::Value << 0;
      if (layers_by_device.size() < 2) return;
      out << YAML::Key << "transfer_map" << YAML::Value << YAML::BeginMap;
      for (size_t i = 1; i < layers_by_device.size(); ++i) {
        out << YAML::Key << layers_by_device[i].second.front() << YAML::Value << YAML::DoubleQuoted
            << layers_by_device[i].first.str();
      }
      out << YAML::EndMap;
    });
  }
  for (const auto& [device, layers] : layers_by_device) {
    emitRule(out, "^model\\.layers\\." + layerAlternation(layers) + "\\.", "", "default",
             [&, d = device] { emitDevices(out, d); });
  }
  emitRule(out, "^model\\.norm$", "", "default",
           [&] { emitDevices(out, placement.find("model.norm")->device); });
  emitRule(out, "^lm_head$", "torch.nn.Linear",
           "ktransformers.operators.linear.KTransformersLinear", [&] {
             emitDevices(out, placement.find("lm_head")->device);
             out << YAML::Key << "generate_op" << YAML::Value << "KLinearTorch";
             out << YAML::Key << "prefill_op" << YAML::Value << "KLinearTorch";
           });
  out << YAML::EndSeq;
  return "# Written by Tandem (tandem plan --rules-out): a KTransformers optimize-rule file.\n"
         "# tandem_* kwargs carry choices only Tandem has (docs/placement.md).\n" +
         std::string(out.c_str()) + "\n";
}

}  // namespace tandem::placement
