#include "engine/gpu/peft_adapter.h"

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "engine/core/error.h"
#include "engine/gpu/weight_loader.h"

namespace tandem::gpu {

namespace {

const std::string kPrefix = "base_model.model.";
const char* const kProjections[] = {"gate_proj", "up_proj", "down_proj"};

nlohmann::json readJson(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) {
    throw Error("cannot read " + path.string(),
                "an adapter dir holds adapter_config.json and adapter_model.safetensors");
  }
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path.string() + " is not valid JSON (" + e.what() + ")", "re-save the adapter");
  }
}

double numberOr(const nlohmann::json& j, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) throw Error(std::string("adapter_config.json: '") + key + "' must be a number");
  return j[key].get<double>();
}

// The scale of a LoRA of `rank` under alpha / rsLoRA.
double loraScale(double alpha, int rank, bool rslora) {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / rank;
}

// The alpha PEFT uses for a module: alpha_pattern entries match by suffix, as in PEFT.
double alphaFor(const nlohmann::json& config, const std::string& name, double alpha) {
  if (config.contains("alpha_pattern") && config["alpha_pattern"].is_object()) {
    for (const auto& [key, value] : config["alpha_pattern"].items()) {
      if (name == key || (name.size() > key.size() && name.ends_with("." + key))) {
        return value.get<double>();
      }
    }
  }
  return alpha;
}

at::Tensor floatTensor(const io::TensorView& view, const std::string& name) {
  return at::from_blob(const_cast<std::byte*>(view.bytes.data()), view.info->shape,
                       at::TensorOptions().dtype(scalarTypeOf(view.info->dtype, name)))
      .to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

int64_t expertIntermediate(const io::ModelConfig& c) {
  return c.architecture == io::Architecture::Mixtral ? c.intermediate_size : c.moe_intermediate_size;
}

struct FusedLayer {
  at::Tensor gate_up_a, gate_up_b, down_a, down_b;  // PEFT's stacked tensors
};

// Splits PEFT's fused tensors (docs/peft_formats.md) into per-expert LoRA.
//   gate_up: lora_A [E*R, 2I] (expert-major rows), lora_B [H, R*E] (rank-major columns);
//   delta_e [2I, H] = s * P_eᵀ Q_eᵀ with P_e = A rows of e [R, 2I], Q_e = B columns of e [H, R].
// So gate: B = P_e[:, :I]ᵀ, A = Q_eᵀ; up: B = P_e[:, I:]ᵀ, A = Q_eᵀ. Block-structured adapters
// (P_e = diag(B_gateᵀ, B_upᵀ)) keep only the diagonal blocks, rank R/2 each.
void splitFused(const std::string& layer_prefix, const FusedLayer& f, const io::ModelConfig& c,
                PeftAdapter& out) {
  const int64_t experts = c.num_experts, hidden = c.hidden_size, inter = expertIntermediate(c);
  const int64_t big_rank = f.gate_up_a.size(0) / experts;
  const int64_t down_rank = f.down_a.size(0) / experts;
  const at::Tensor p = f.gate_up_a.view({experts, big_rank, 2 * inter});
  const at::Tensor q = f.gate_up_b.view({hidden, big_rank, experts});
  const at::Tensor pd = f.down_a.view({experts, down_rank, hidden});
  const at::Tensor qd = f.down_b.view({inter, down_rank, experts});
  const int64_t half = big_rank / 2;
  const bool block = big_rank % 2 == 0 && half == down_rank &&
                     p.narrow(1, 0, half).narrow(2, inter, inter).abs().max().item<float>() == 0 &&
                     p.narrow(1, half, half).narrow(2, 0, inter).abs().max().item<float>() == 0;
  const int64_t rank = block ? half : std::max(big_rank, down_rank);
  out.expert_rank = static_cast<int>(rank);
  for (int64_t e = 0; e < experts; ++e) {
    const std::string base = layer_prefix + "mlp.experts." + std::to_string(e) + ".";
    const at::Tensor p_e = p[e], q_e = q.select(2, e);  // [R, 2I], [H, R]
    if (block) {
      out.a[base + "gate_proj"] = q_e.narrow(1, 0, half).t().contiguous();
      out.b[base + "gate_proj"] = p_e.narrow(0, 0, half).narrow(1, 0, inter).t().contiguous();
      out.a[base + "up_proj"] = q_e.narrow(1, half, half).t().contiguous();
      out.b[base + "up_proj"] = p_e.narrow(0, half, half).narrow(1, inter, inter).t().contiguous();
    } else {
      // Exact for any adapter: gate and up share A; ranks padded with zeros to `rank`.
      out.a[base + "gate_proj"] = at::constant_pad_nd(q_e.t(), {0, 0, 0, rank - big_rank});
      out.a[base + "up_proj"] = out.a[base + "gate_proj"].clone();
      out.b[base + "gate_proj"] = at::constant_pad_nd(p_e.narrow(1, 0, inter).t(), {0, rank - big_rank});
      out.b[base + "up_proj"] = at::constant_pad_nd(p_e.narrow(1, inter, inter).t(), {0, rank - big_rank});
    }
    // down: delta_e [H, I] = s * (Qd_e Pd_e)ᵀ, so B = Pd_eᵀ [H, r], A = Qd_eᵀ [r, I].
    out.a[base + "down_proj"] =
        at::constant_pad_nd(qd.select(2, e).t(), {0, 0, 0, rank - down_rank}).contiguous();
    out.b[base + "down_proj"] =
        at::constant_pad_nd(pd[e].t(), {0, rank - down_rank}).contiguous();
  }
}

// Mixtral's old per-expert names map onto the gate/up/down ones.
std::string canonicalModule(std::string name) {
  static const std::regex mixtral(R"((model\.layers\.\d+\.)block_sparse_moe\.experts\.(\d+)\.w([123]))");
  std::smatch m;
  if (std::regex_match(name, m, mixtral)) {
    const char* leaf = m[3] == "1" ? "gate_proj" : m[3] == "3" ? "up_proj" : "down_proj";
    return m[1].str() + "mlp.experts." + m[2].str() + "." + leaf;
  }
  return name;
}

}  // namespace

PeftAdapter readPeftAdapter(const std::filesystem::path& dir, const io::ModelConfig& config) {
  const nlohmann::json cfg = readJson(dir / "adapter_config.json");
  if (cfg.value("peft_type", std::string("LORA")) != "LORA") {
    throw Error(dir.string() + ": peft_type is " + cfg["peft_type"].dump() + ", Tandem reads LoRA adapters",
                "use a LoRA adapter");
  }
  if (cfg.value("use_dora", false)) throw Error(dir.string() + ": DoRA adapters are not supported");
  if (cfg.contains("bias") && cfg["bias"].is_string() && cfg["bias"] != "none") {
    throw Error(dir.string() + ": adapters that train biases are not supported (bias = " +
                cfg["bias"].dump() + ")");
  }
  PeftAdapter adapter;
  adapter.dir = dir;
  adapter.settings.rank = static_cast<int>(numberOr(cfg, "r", 8));
  adapter.settings.alpha = numberOr(cfg, "lora_alpha", 8);
  adapter.settings.rslora = cfg.value("use_rslora", false);
  adapter.settings.dropout = numberOr(cfg, "lora_dropout", 0);
  if (adapter.settings.rank <= 0) throw Error(dir.string() + ": r must be positive");

  const std::filesystem::path weights_path = dir / "adapter_model.safetensors";
  if (!std::filesystem::exists(weights_path)) {
    throw Error("no adapter_model.safetensors in " + dir.string(),
                std::filesystem::exists(dir / "adapter_model.bin")
                    ? "this adapter is a pickle (.bin); re-save it with safe_serialization=True"
                    : "the adapter dir is incomplete");
  }
  const io::SafetensorsFile file = io::SafetensorsFile::open(weights_path);
  std::map<std::string, FusedLayer> fused;
  static const std::regex fused_key(R"((model\.layers\.\d+\.)mlp\.experts\.((?:base_layer\.)*)lora_([AB])\.weight)");
  for (const io::TensorInfo& info : file.header().tensors) {
    const std::string& key = info.name;
    if (!key.starts_with(kPrefix) || !(key.ends_with(".lora_A.weight") || key.ends_with(".lora_B.weight"))) {
      throw Error(weights_path.string() + ": tensor " + key + " is not a LoRA A/B weight",
                  "Tandem reads plain LoRA adapters (no modules_to_save, no embedding LoRA)");
    }
    const std::string name = key.substr(kPrefix.size());
    const at::Tensor t = floatTensor(file.view(key), key);
    std::smatch m;
    if (std::regex_match(name, m, fused_key)) {
      FusedLayer& layer = fused[m[1].str()];
      // The outer wrapper is down_proj when PEFT wrapped [gate_up_proj, down_proj]; tell them
      // apart by shape (gate_up's lora_A has 2I columns, down's has H).
      // PEFT nests the wrapper of the first target parameter (gate_up_proj) inside: the inner
      // one's keys carry "base_layer.". Shapes decide when they differ (2I vs H, H vs I).
      const bool is_a = m[3] == "A";
      const int64_t inter = expertIntermediate(config);
      const bool inner = m[2].length() > 0;
      const bool gate_up = is_a ? (2 * inter != config.hidden_size ? t.size(1) == 2 * inter : inner)
                                : (inter != config.hidden_size ? t.size(0) == config.hidden_size : inner);
      (is_a ? (gate_up ? layer.gate_up_a : layer.down_a) : (gate_up ? layer.gate_up_b : layer.down_b)) = t;
      continue;
    }
    const bool is_a = key.ends_with(".lora_A.weight");
    const std::string module = canonicalModule(name.substr(0, name.size() - std::string(".lora_A.weight").size()));
    (is_a ? adapter.a : adapter.b)[module] = t;
  }
  for (const auto& [prefix, layer] : fused) {
    if (!layer.gate_up_a.defined() || !layer.gate_up_b.defined() || !layer.down_a.defined() ||
        !layer.down_b.defined()) {
      throw Error(weights_path.string() + ": the fused expert LoRA of " + prefix +
                      "mlp.experts is incomplete (needs gate_up_proj and down_proj, A and B)",
                  "target both mlp.experts.gate_up_proj and mlp.experts.down_proj");
    }
    const double scale_gu = loraScale(alphaFor(cfg, "mlp.experts.gate_up_proj", adapter.settings.alpha),
                                      static_cast<int>(layer.gate_up_a.size(0) / config.num_experts),
                                      adapter.settings.rslora);
    const double scale_down = loraScale(alphaFor(cfg, "mlp.experts.down_proj", adapter.settings.alpha),
                                        static_cast<int>(layer.down_a.size(0) / config.num_experts),
                                        adapter.settings.rslora);
    FusedLayer scaled = layer;
    // The experts run with the adapter's base scale; fold each projection's own into B.
    const double base = adapter.settings.scale();
    scaled.gate_up_a = layer.gate_up_a * (scale_gu / base);
    scaled.down_a = layer.down_a * (scale_down / base);
    splitFused(prefix, scaled, config, adapter);
  }
  for (const auto& [module, a] : adapter.a) {
    if (!adapter.b.count(module)) throw Error(weights_path.string() + ": " + module + " has lora_A but no lora_B");
    if (module.find(".mlp.experts.") == std::string::npos && a.size(0) != adapter.settings.rank) {
      throw Error(weights_path.string() + ": " + module + " has rank " + std::to_string(a.size(0)) +
                      " but r is " + std::to_string(adapter.settings.rank),
                  "per-module ranks (rank_pattern) are not supported yet");
    }
  }
  if (adapter.expert_rank == 0) {
    for (const auto& [module, a] : adapter.a) {
      if (module.find(".mlp.experts.") != std::string::npos) adapter.expert_rank = static_cast<int>(a.size(0));
    }
  }
  return adapter;
}

LoraPlan loraPlanFor(const PeftAdapter& adapter) {
  LoraPlan plan;
  plan.settings = adapter.settings;
  plan.expert_rank = adapter.expert_rank;
  std::set<std::string> modules;
  static const std::regex expert(R"((model\.layers\.\d+\.mlp\.experts\.)\d+\.(\w+))");
  for (const auto& [module, a] : adapter.a) {
    std::smatch m;
    modules.insert(std::regex_match(module, m, expert) ? m[1].str() + m[2].str() : module);
  }
  plan.targets = [modules](const std::string& name) { return modules.count(name) > 0; };
  return plan;
}

void applyPeftAdapter(const PeftAdapter& adapter, CausalLm& model) {
  std::set<std::string> used;
  model.visitLinears([&](const std::string& name, LoraLinear& linear) {
    auto a = adapter.a.find(name);
    if (a == adapter.a.end()) return;
    try {
      linear.attachLora(adapter.settings, a->second, adapter.b.at(name));
    } catch (const Error& e) {
      throw Error(adapter.dir.string() + ": " + name + ": " + e.message(), e.whatToDo());
    }
    used.insert(name);
  });
  model.visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
    experts::ExpertLora& lora = block.experts->lora();
    for (int p = 0; p < experts::kExpertProjCount; ++p) {
      const auto proj = static_cast<experts::ExpertProj>(p);
      if (!lora.targets(proj)) continue;
      for (int64_t e = 0; e < lora.numExperts(); ++e) {
        const std::string name = mlp + ".experts." + std::to_string(e) + "." + kProjections[p];
        auto a = adapter.a.find(name);
        if (a == adapter.a.end()) {  // an expert the adapter leaves alone: no delta
          std::fill(lora.a(proj, e).begin(), lora.a(proj, e).end(), 0.0f);
          std::fill(lora.b(proj, e).begin(), lora.b(proj, e).end(), 0.0f);
          continue;
        }
        const at::Tensor& b = adapter.b.at(name);
        if (a->second.size(0) != lora.rank() || a->second.size(1) != lora.inFeatures(proj) ||
            b.size(0) != lora.outFeatures(proj) || b.size(1) != lora.rank()) {
          throw Error(adapter.dir.string() + ": " + name + " has LoRA shapes that do not fit the expert",
                      "the adapter was made for another model");
        }
        lora.loadExpert(proj, e, a->second.contiguous().data_ptr<float>(), b.contiguous().data_ptr<float>());
        used.insert(name);
      }
    }
  });
  for (const auto& [module, a] : adapter.a) {
    if (!used.count(module)) {
      throw Error(adapter.dir.string() + ": the adapter has LoRA weights for " + module +
                      ", which this model does not have (or cannot train: routers, lm_head)",
                  "use the adapter with the model it was trained on");
    }
  }
}

std::map<std::string, at::Tensor> loraTensors(CausalLm& model, bool gradients) {
  std::map<std::string, at::Tensor> out;
  auto cpu = [](const at::Tensor& t) {
    return t.defined() ? t.detach().to(at::kCPU, at::kFloat).contiguous() : at::Tensor();
  };
  model.visitLinears([&](const std::string& name, LoraLinear& linear) {
    if (!linear.hasLora()) return;
    at::Tensor a = gradients ? linear.loraA().grad() : linear.loraA();
    at::Tensor b = gradients ? linear.loraB().grad() : linear.loraB();
    if (!a.defined()) a = at::zeros_like(linear.loraA());
    if (!b.defined()) b = at::zeros_like(linear.loraB());
    out[kPrefix + name + ".lora_A.weight"] = cpu(a);
    out[kPrefix + name + ".lora_B.weight"] = cpu(b);
  });
  model.visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
    const experts::ExpertLora& lora = block.experts->lora();
    for (int p = 0; p < experts::kExpertProjCount; ++p) {
      const auto proj = static_cast<experts::ExpertProj>(p);
      if (!lora.targets(proj)) continue;
      for (int64_t e = 0; e < lora.numExperts(); ++e) {
        const std::string name = kPrefix + mlp + ".experts." + std::to_string(e) + "." + kProjections[p];
        auto copy = [](std::span<const float> s, std::vector<int64_t> shape) {
          return at::from_blob(const_cast<float*>(s.data()), shape, at::kFloat).clone();
        };
        const int64_t r = lora.rank();
        out[name + ".lora_A.weight"] =
            copy(gradients ? lora.gradA(proj, e) : lora.a(proj, e), {r, lora.inFeatures(proj)});
        out[name + ".lora_B.weight"] =
            copy(gradients ? lora.gradB(proj, e) : lora.b(proj, e), {lora.outFeatures(proj), r});
      }
    }
  });
  return out;
}

}  // namespace tandem::gpu
