#include "engine/model/peft_adapter.h"

#include <ATen/ATen.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <tuple>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/io/atomic_file.h"
#include "engine/io/bounded_json.h"
#include "engine/io/safetensors.h"
#include "engine/model/peft_adapter_config.h"
#include "engine/model/weight_loader.h"

namespace tandem::model {

namespace {

const std::string kPrefix = "base_model.model.";
constexpr size_t kMaxTensorNameBytes = 1024;

// The scale of a LoRA of `rank` under alpha / rsLoRA.
double loraScale(double alpha, int rank, bool rslora) {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / rank;
}

at::Tensor floatTensor(const io::TensorView& view, const std::string& name) {
  return at::from_blob(const_cast<std::byte*>(view.bytes.data()), view.info->shape,
                       at::TensorOptions().dtype(scalarTypeOf(view.info->dtype, name)))
      .to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

struct FusedLayer {
  at::Tensor gate_up_a, gate_up_b, down_a, down_b;  // PEFT's stacked tensors
  std::string gate_up_a_key, gate_up_b_key, down_a_key, down_b_key;
};

std::string shapeText(const at::Tensor& t) { return formatShape(t.sizes().vec()); }

// Checks a fused layer's four shapes against the model: [E*R, 2I], [H, R*E], [E*r, H], [I, r*E].
void checkFusedShapes(const FusedLayer& f, const io::ModelConfig& c, const std::string& file) {
  const int64_t experts = c.num_experts, hidden = c.hidden_size, inter = c.moe_intermediate_size;
  auto fail = [&](const std::string& key, const at::Tensor& t, const std::string& want) {
    throw Error(file + ": tensor " + key + " has shape " + shapeText(t) + ", expected " + want +
                    " for " + std::to_string(experts) + " experts (hidden " +
                    std::to_string(hidden) + ", intermediate " + std::to_string(inter) + ")",
                "the adapter was made for another model, or the file is damaged");
  };
  const bool ok_a = f.gate_up_a.dim() == 2 && f.gate_up_a.size(0) % experts == 0 &&
                    f.gate_up_a.size(1) == 2 * inter;
  if (!ok_a) fail(f.gate_up_a_key, f.gate_up_a, "[E*R, 2I]");
  const int64_t big_rank = f.gate_up_a.size(0) / experts;
  if (f.gate_up_b.dim() != 2 || f.gate_up_b.size(0) != hidden ||
      f.gate_up_b.size(1) != big_rank * experts) {
    fail(f.gate_up_b_key, f.gate_up_b,
         "[" + std::to_string(hidden) + ", " + std::to_string(big_rank * experts) + "]");
  }
  if (f.down_a.dim() != 2 || f.down_a.size(0) % experts != 0 || f.down_a.size(1) != hidden) {
    fail(f.down_a_key, f.down_a, "[E*r, " + std::to_string(hidden) + "]");
  }
  const int64_t rank = f.down_a.size(0) / experts;
  if (f.down_b.dim() != 2 || f.down_b.size(0) != inter || f.down_b.size(1) != rank * experts) {
    fail(f.down_b_key, f.down_b,
         "[" + std::to_string(inter) + ", " + std::to_string(rank * experts) + "]");
  }
}

// Splits PEFT's fused tensors (docs/peft_formats.md) into per-expert LoRA.
//   gate_up: lora_A [E*R, 2I] (expert-major rows), lora_B [H, R*E] (rank-major columns);
//   delta_e [2I, H] = s * P_eᵀ Q_eᵀ with P_e = A rows of e [R, 2I], Q_e = B columns of e [H, R].
// So gate: B = P_e[:, :I]ᵀ, A = Q_eᵀ; up: B = P_e[:, I:]ᵀ, A = Q_eᵀ. Block-structured adapters
// (P_e = diag(B_gateᵀ, B_upᵀ)) keep only the diagonal blocks, rank R/2 each.
void splitFused(const std::string& layer_prefix, const FusedLayer& f, const io::ModelConfig& c,
                PeftAdapter& out) {
  const int64_t experts = c.num_experts, hidden = c.hidden_size, inter = c.moe_intermediate_size;
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
      out.b[base + "gate_proj"] =
          at::constant_pad_nd(p_e.narrow(1, 0, inter).t(), {0, rank - big_rank});
      out.b[base + "up_proj"] =
          at::constant_pad_nd(p_e.narrow(1, inter, inter).t(), {0, rank - big_rank});
    }
    // down: delta_e [H, I] = s * (Qd_e Pd_e)ᵀ, so B = Pd_eᵀ [H, r], A = Qd_eᵀ [r, I].
    out.a[base + "down_proj"] =
        at::constant_pad_nd(qd.select(2, e).t(), {0, 0, 0, rank - down_rank}).contiguous();
    out.b[base + "down_proj"] = at::constant_pad_nd(pd[e].t(), {0, rank - down_rank}).contiguous();
  }
}

// Converts one wrapper's (lora_A, lora_B) between PEFT's two fused layouts (an involution):
//   other_A[e*R + j, :] = B[:, j*E + e],  other_B[:, j*E + e] = A[e*R + j, :].
std::pair<at::Tensor, at::Tensor> swapFusedLayout(const at::Tensor& a, const at::Tensor& b,
                                                  int64_t experts) {
  const int64_t rank = a.size(0) / experts;
  const int64_t a_cols = a.size(1), b_rows = b.size(0);
  at::Tensor other_a =
      b.view({b_rows, rank, experts}).permute({2, 1, 0}).reshape({experts * rank, b_rows});
  at::Tensor other_b =
      a.view({experts, rank, a_cols}).permute({2, 1, 0}).reshape({a_cols, rank * experts});
  return {other_a.contiguous(), other_b.contiguous()};
}

struct WrapperPair {
  at::Tensor a, b;
  std::string a_key, b_key;
};

// PEFT's ParamWrapper stores a 3-D expert parameter's LoRA in one of two layouts:
//   PEFT 0.18-0.20 read HF's [E, out, in] as [E, in, out]: lora_A [E*R, out], lora_B [in, R*E];
//   PEFT >= 0.21 fixed that:                                lora_A [E*R, in],  lora_B [out, R*E].
// (gate_up_proj: in = H, out = 2I; down_proj: in = I, out = H.) The shapes tell which parameter
// and which layout a wrapper holds, except when 2I == H, where adapter_config's peft_version
// decides. Newer-layout tensors are converted to the older one, which splitFused reads:
//   old_A[e*R + j, :] = new_B[:, j*E + e],  old_B[:, j*E + e] = new_A[e*R + j, :].
void assignWrapper(const WrapperPair& pair, const io::ModelConfig& c, const PeftAdapterConfig& cfg,
                   const std::string& file, FusedLayer& layer) {
  if (!pair.a.defined() || !pair.b.defined() || pair.a.dim() != 2 || pair.b.dim() != 2) {
    throw Error(file + ": " + (pair.a.defined() ? pair.a_key : pair.b_key) +
                    " has no matching lora_A/lora_B partner of rank 2",
                "the adapter file is incomplete or damaged");
  }
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size, experts = c.num_experts;
  const int64_t cols = pair.a.size(1), rows = pair.b.size(0);
  const std::string& version = cfg.peft_version;
  const bool newer_peft = !version.empty() && version.rfind("0.18", 0) != 0 &&
                          version.rfind("0.19", 0) != 0 && version.rfind("0.20", 0) != 0;
  bool gate_up = false, newer_layout = false;
  if (cols == 2 * inter && rows == hidden && !(cols == hidden && rows == 2 * inter && newer_peft)) {
    gate_up = true;
  } else if (cols == hidden && rows == 2 * inter) {
    gate_up = newer_layout = true;
  } else if (cols == hidden && rows == inter) {
    gate_up = false;
  } else if (cols == inter && rows == hidden) {
    newer_layout = true;
  } else {
    throw Error(file + ": tensors " + pair.a_key + " " + shapeText(pair.a) + " and " + pair.b_key +
                    " " + shapeText(pair.b) +
                    " fit neither mlp.experts.gate_up_proj nor down_proj of this model",
                "the adapter was made for another model, or the file is damaged");
  }
  at::Tensor a = pair.a, b = pair.b;
  if (newer_layout) std::tie(a, b) = swapFusedLayout(pair.a, pair.b, experts);
  (gate_up ? layer.gate_up_a : layer.down_a) = a.contiguous();
  (gate_up ? layer.gate_up_b : layer.down_b) = b.contiguous();
  (gate_up ? layer.gate_up_a_key : layer.down_a_key) = pair.a_key;
  (gate_up ? layer.gate_up_b_key : layer.down_b_key) = pair.b_key;
}

// Mixtral's old per-expert names map onto the gate/up/down ones.
std::string canonicalModule(std::string name) {
  static const std::regex mixtral(
      R"((model\.layers\.\d+\.)block_sparse_moe\.experts\.(\d+)\.w([123]))");
  std::smatch m;
  if (std::regex_match(name, m, mixtral)) {
    const char* leaf = m[3] == "1" ? "gate_proj" : m[3] == "3" ? "up_proj" : "down_proj";
    return m[1].str() + "mlp.experts." + m[2].str() + "." + leaf;
  }
  return name;
}

}  // namespace

PeftAdapter readPeftAdapter(const std::filesystem::path& dir, const io::ModelConfig& config) {
  const PeftAdapterConfig cfg = readPeftAdapterConfig(dir);
  PeftAdapter adapter;
  adapter.dir = dir;
  adapter.settings.rank = cfg.rank;
  adapter.settings.alpha = cfg.alpha;
  adapter.settings.rslora = cfg.rslora;
  adapter.settings.dropout = cfg.dropout;

  const std::filesystem::path weights_path = dir / "adapter_model.safetensors";
  if (!std::filesystem::exists(weights_path)) {
    throw Error("no adapter_model.safetensors in " + dir.string(),
                std::filesystem::exists(dir / "adapter_model.bin")
                    ? "this adapter is a pickle (.bin); re-save it with safe_serialization=True"
                    : "the adapter dir is incomplete");
  }
  const io::SafetensorsFile file = io::SafetensorsFile::open(weights_path);
  std::map<std::string, std::map<size_t, WrapperPair>> wrappers;  // layer prefix -> depth -> A/B
  static const std::regex fused_key(
      R"((model\.layers\.\d+\.)mlp\.experts\.((?:base_layer\.)*)lora_([AB])\.weight)");
  for (const io::TensorInfo& info : file.header().tensors) {
    const std::string& key = info.name;
    // std::regex recurses once per character it matches: a name of 100k digits overflowed the
    // stack in regex_match. PEFT's names are a few hundred bytes at most.
    if (key.size() > kMaxTensorNameBytes) {
      throw Error(weights_path.string() + ": tensor name " + io::excerptForMessage(key) +
                      " is longer than any LoRA weight's name",
                  "the adapter file is damaged or not a PEFT LoRA adapter");
    }
    if (!key.starts_with(kPrefix) ||
        !(key.ends_with(".lora_A.weight") || key.ends_with(".lora_B.weight"))) {
      throw Error(weights_path.string() + ": tensor " + io::excerptForMessage(key) +
                      " is not a LoRA A/B weight",
                  "Tandem reads plain LoRA adapters (no modules_to_save, no embedding LoRA)");
    }
    const std::string name = key.substr(kPrefix.size());
    const at::Tensor t = floatTensor(file.view(key), key);
    std::smatch m;
    if (std::regex_match(name, m, fused_key)) {
      // Collected per wrapper (nesting depth) first; which parameter each wrapper holds, and
      // in which PEFT layout, is decided from the pair's shapes below.
      WrapperPair& pair = wrappers[m[1].str()][m[2].length()];
      (m[3] == "A" ? pair.a : pair.b) = t;
      (m[3] == "A" ? pair.a_key : pair.b_key) = key;
      continue;
    }
    const bool is_a = key.ends_with(".lora_A.weight");
    const std::string module =
        canonicalModule(name.substr(0, name.size() - std::string(".lora_A.weight").size()));
    (is_a ? adapter.a : adapter.b)[module] = t;
  }
  if (!wrappers.empty() && config.num_experts <= 0) {
    // The fused layouts are split per expert (a division by the expert count).
    throw Error(weights_path.string() + ": " + wrappers.begin()->first +
                    "mlp.experts has fused expert LoRA, but the model has no routed experts",
                "the adapter was made for another model");
  }
  std::map<std::string, FusedLayer> fused;
  for (const auto& [prefix, by_depth] : wrappers) {
    FusedLayer& layer = fused[prefix];
    for (const auto& [depth, pair] : by_depth)
      assignWrapper(pair, config, cfg, weights_path.string(), layer);
  }
  for (const auto& [prefix, layer] : fused) {
    if (!layer.gate_up_a.defined() || !layer.gate_up_b.defined() || !layer.down_a.defined() ||
        !layer.down_b.defined()) {
      throw Error(weights_path.string() + ": the fused expert LoRA of " + prefix +
                      "mlp.experts is incomplete (needs gate_up_proj and down_proj, A and B)",
                  "target both mlp.experts.gate_up_proj and mlp.experts.down_proj");
    }
    checkFusedShapes(layer, config, weights_path.string());
    const double scale_gu = loraScale(
        cfg.alphaFor("mlp.experts.gate_up_proj"),
        static_cast<int>(layer.gate_up_a.size(0) / config.num_experts), adapter.settings.rslora);
    const double scale_down = loraScale(cfg.alphaFor("mlp.experts.down_proj"),
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
    if (!adapter.b.count(module))
      throw Error(weights_path.string() + ": " + module + " has lora_A but no lora_B");
    if (module.find(".mlp.experts.") == std::string::npos && a.size(0) != adapter.settings.rank) {
      throw Error(weights_path.string() + ": " + module + " has rank " + std::to_string(a.size(0)) +
                      " but r is " + std::to_string(adapter.settings.rank),
                  "per-module ranks (rank_pattern) are not supported yet");
    }
  }
  if (adapter.expert_rank == 0) {
    for (const auto& [module, a] : adapter.a) {
      if (module.find(".mlp.experts.") != std::string::npos)
        adapter.expert_rank = static_cast<int>(a.size(0));
    }
  }
  adapter.lora_experts = readLoraExperts(dir, config);
  return adapter;
}

LoraPlan loraPlanFor(const PeftAdapter& adapter) {
  LoraPlan plan;
  plan.settings = adapter.settings;
  plan.expert_rank = adapter.expert_rank;
  plan.lora_experts = adapter.lora_experts.count;
  plan.le_dim = adapter.lora_experts.le_dim;
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
  model.visitLinears([&](const std::string& name, gpu::LoraLinear& linear) {
    auto a = adapter.a.find(name);
    if (a == adapter.a.end()) return;
    const at::Tensor& b = adapter.b.at(name);
    const int64_t r = adapter.settings.rank;
    const bool a_fits =
        a->second.dim() == 2 && a->second.size(0) == r && a->second.size(1) == linear.inFeatures();
    const bool b_fits = b.dim() == 2 && b.size(0) == linear.outFeatures() && b.size(1) == r;
    if (!a_fits || !b_fits) {
      const std::string key = kPrefix + name + (a_fits ? ".lora_B.weight" : ".lora_A.weight");
      throw Error(adapter.dir.string() + ": tensor " + key + " has shape " +
                      shapeText(a_fits ? b : a->second) + ", but " + name + " needs A [" +
                      std::to_string(r) + ", " + std::to_string(linear.inFeatures()) + "] and B [" +
                      std::to_string(linear.outFeatures()) + ", " + std::to_string(r) + "]",
                  "the adapter was made for another model, or the file is damaged");
    }
    linear.attachLora(adapter.settings, a->second, b);
    used.insert(name);
  });
  model.visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
    experts::ExpertLora& lora = block.experts->lora();
    for (int p = 0; p < experts::kExpertProjCount; ++p) {
      const auto proj = static_cast<experts::ExpertProj>(p);
      if (!lora.targets(proj)) continue;
      for (int64_t e = 0; e < lora.numExperts(); ++e) {
        const std::string name = mlp + ".experts." + std::to_string(e) + "." +
                                 std::string(experts::expertProjName(proj));
        auto a = adapter.a.find(name);
        if (a == adapter.a.end()) {  // an expert the adapter leaves alone: no delta
          std::fill(lora.a(proj, e).begin(), lora.a(proj, e).end(), 0.0f);
          std::fill(lora.b(proj, e).begin(), lora.b(proj, e).end(), 0.0f);
          continue;
        }
        const at::Tensor& b = adapter.b.at(name);
        if (a->second.size(0) != lora.rank() || a->second.size(1) != lora.inFeatures(proj) ||
            b.size(0) != lora.outFeatures(proj) || b.size(1) != lora.rank()) {
          throw Error(adapter.dir.string() + ": tensors " + kPrefix + name +
                          ".lora_A/B.weight have shapes " + shapeText(a->second) + " and " +
                          shapeText(b) + ", which do not fit the expert",
                      "the adapter was made for another model, or the file is damaged");
        }
        lora.loadExpert(proj, e, a->second.contiguous().data_ptr<float>(),
                        b.contiguous().data_ptr<float>());
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
  applyLoraExperts(adapter.lora_experts, model, adapter.dir);
}

std::map<std::string, at::Tensor> loraTensors(CausalLm& model, bool gradients) {
  std::map<std::string, at::Tensor> out;
  auto cpu = [](const at::Tensor& t) {
    return t.defined() ? t.detach().to(at::kCPU, at::kFloat).contiguous() : at::Tensor();
  };
  model.visitLinears([&](const std::string& name, gpu::LoraLinear& linear) {
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
        const std::string name = kPrefix + mlp + ".experts." + std::to_string(e) + "." +
                                 std::string(experts::expertProjName(proj));
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

namespace {

// One MoE layer's per-expert LoRA in PEFT's fused layout (docs/peft_formats.md, section 2):
//   gate_up lora_A [E*2r, 2I]: rows e*2r + j hold B_gateᵀ (cols < I), rows e*2r + r + j B_upᵀ;
//   gate_up lora_B [H, 2r*E]: column j*E + e holds A_gate row j, column (r + j)*E + e A_up's;
//   down lora_A [E*r, H] holds B_downᵀ, down lora_B [I, r*E] A_down, with the same strides.
FusedLayer fuseExperts(const experts::ExpertLora& lora) {
  const int64_t experts = lora.numExperts(), r = lora.rank();
  const int64_t hidden = lora.inFeatures(experts::ExpertProj::Gate);
  const int64_t inter = lora.outFeatures(experts::ExpertProj::Gate);
  FusedLayer f;
  f.gate_up_a = at::zeros({experts * 2 * r, 2 * inter});
  f.gate_up_b = at::zeros({hidden, 2 * r * experts});
  f.down_a = at::zeros({experts * r, hidden});
  f.down_b = at::zeros({inter, r * experts});
  auto matrix = [](std::span<const float> s, int64_t rows, int64_t cols) {
    return at::from_blob(const_cast<float*>(s.data()), {rows, cols}, at::kFloat);
  };
  for (int64_t e = 0; e < experts; ++e) {
    for (int half = 0; half < 2; ++half) {
      const auto proj = half == 0 ? experts::ExpertProj::Gate : experts::ExpertProj::Up;
      if (!lora.targets(proj)) continue;
      const at::Tensor a = matrix(lora.a(proj, e), r, hidden);  // [r, H]
      const at::Tensor b = matrix(lora.b(proj, e), inter, r);   // [I, r]
      f.gate_up_a.narrow(0, e * 2 * r + half * r, r).narrow(1, half * inter, inter).copy_(b.t());
      for (int64_t j = 0; j < r; ++j)
        f.gate_up_b.select(1, (half * r + j) * experts + e).copy_(a[j]);
    }
    if (lora.targets(experts::ExpertProj::Down)) {
      const at::Tensor a = matrix(lora.a(experts::ExpertProj::Down, e), r, inter);   // [r, I]
      const at::Tensor b = matrix(lora.b(experts::ExpertProj::Down, e), hidden, r);  // [H, r]
      f.down_a.narrow(0, e * r, r).copy_(b.t());
      for (int64_t j = 0; j < r; ++j) f.down_b.select(1, j * experts + e).copy_(a[j]);
    }
  }
  return f;
}

std::string leafOf(const std::string& name) { return name.substr(name.rfind('.') + 1); }

bool isFused(ExpertAdapterForm form) { return form != ExpertAdapterForm::PerExpert; }

}  // namespace

void writePeftAdapter(CausalLm& model, const gpu::LoraSettings& settings,
                      const std::filesystem::path& dir, ExpertAdapterForm form,
                      const std::string& base_model_name) {
  std::filesystem::create_directories(dir);
  std::map<std::string, at::Tensor> tensors;
  std::set<std::string> target_modules;
  bool router_lora = false, expert_lora = false;
  for (auto& [key, t] : loraTensors(model, /*gradients=*/false)) {
    const std::string module = key.substr(
        kPrefix.size(), key.size() - kPrefix.size() - std::string(".lora_A.weight").size());
    const bool is_expert = module.find(".mlp.experts.") != std::string::npos;
    expert_lora |= is_expert;
    if (module.ends_with(".mlp.gate")) {
      router_lora = true;
    } else if (!(is_expert && isFused(form))) {
      // In the fused form the experts are target_parameters; their leaf names in
      // target_modules would make PEFT wrap dense MLPs the adapter does not train.
      target_modules.insert(leafOf(module));
    }
    if (!(is_expert && isFused(form))) tensors[key] = t;
  }
  nlohmann::json target_parameters = nlohmann::json::array();
  nlohmann::json rank_pattern = nlohmann::json::object(), alpha_pattern = nlohmann::json::object();
  if (expert_lora && isFused(form)) {
    model.visitMoeBlocks([&](const std::string& mlp, MoeBlock& block) {
      FusedLayer f = fuseExperts(block.experts->lora());
      if (form == ExpertAdapterForm::FusedPeft021) {
        const int64_t experts = block.experts->lora().numExperts();
        std::tie(f.gate_up_a, f.gate_up_b) = swapFusedLayout(f.gate_up_a, f.gate_up_b, experts);
        std::tie(f.down_a, f.down_b) = swapFusedLayout(f.down_a, f.down_b, experts);
      }
      const std::string base = kPrefix + mlp + ".experts.";
      tensors[base + "base_layer.lora_A.weight"] = f.gate_up_a;
      tensors[base + "base_layer.lora_B.weight"] = f.gate_up_b;
      tensors[base + "lora_A.weight"] = f.down_a;
      tensors[base + "lora_B.weight"] = f.down_b;
    });
    target_parameters = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
    rank_pattern["mlp.experts.gate_up_proj"] = 2 * settings.rank;
    // Same scale at rank 2r: alpha/r = alpha'/(2r), or alpha/sqrt(r) = alpha'/sqrt(2r).
    alpha_pattern["mlp.experts.gate_up_proj"] =
        settings.rslora ? settings.alpha * std::sqrt(2.0) : 2 * settings.alpha;
  }
  if (router_lora) target_parameters.push_back("mlp.gate.weight");
  const nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model_name},
      {"r", settings.rank},
      {"lora_alpha", settings.alpha},
      {"lora_dropout", settings.dropout},
      {"use_rslora", settings.rslora},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"init_lora_weights", true},
      {"target_modules", std::vector<std::string>(target_modules.begin(), target_modules.end())},
      {"target_parameters",
       target_parameters.empty() ? nlohmann::json(nullptr) : target_parameters},
      {"rank_pattern", rank_pattern},
      {"alpha_pattern", alpha_pattern},
      {"modules_to_save", nullptr},
      {"use_dora", false},
      // Which fused layout this is (PEFT >= 0.21 reads 3-D expert LoRA the other way round).
      {"peft_version", form == ExpertAdapterForm::FusedPeft021 ? "0.21.0" : "0.18.1"},
  };
  writeTensorFile(dir / "adapter_model.safetensors", tensors);
  writeLoraExperts(model, dir);
  io::writeFileAtomically(dir / "adapter_config.json", config.dump(2) + "\n");
}

}  // namespace tandem::model
